"""Transport-session caps, global and per agent (issue #12 point 3).

With ``max_transport_sessions_per_agent = 2``, an agent that opened two
sessions is refused a third (503 ``too_many_sessions``) while another agent
still gets its own; ending one of its sessions frees its share again.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream, gateway_config
from tests.e2e.issue4_support import assert_refused, initialize_message, mcp_headers, open_session
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


async def test_one_agent_cannot_take_every_transport_session(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Alice's third session is refused at her share; Bob still opens one; a DELETE frees Alice's share."""
    config = gateway_config(
        tmp_path, tools_upstream.url, max_transport_sessions=4, max_transport_sessions_per_agent=2
    )
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path)
    )
    alice, bob = TOKENS["alice"], TOKENS["bob"]
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        first = await open_session(http, url, alice)
        await open_session(http, url, alice)
        refused = await http.post(url, headers=mcp_headers(alice), json=initialize_message())
        assert_refused(refused, 503, "too_many_sessions")
        assert await open_session(http, url, bob)
        ended = await http.delete(url, headers=mcp_headers(alice, first))
        assert ended.status_code == 200
        assert await open_session(http, url, alice)
