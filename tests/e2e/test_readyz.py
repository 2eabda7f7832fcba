"""``/readyz``: a bare verdict for anyone, the detail for the admin, and a dead upstream's cause named.

Issue #12 points 12 and 15. A DNS-rebinding page can read whatever ``/readyz``
tells any caller, so without the admin credential it says only ready or not;
``/healthz`` stays open. With the admin credential, each upstream that is down
says why: the connection error of an HTTP upstream, the exit status and last
stderr line of a stdio server that died.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS
from tests.e2e.issue4_support import ADMIN_TOKEN, WAIT_S, auth_table, bearer
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

_DIES = "import sys; sys.stderr.write('boom: NOTES_API_KEY is not set\\n'); sys.exit(3)"


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_readyz_detail_is_for_the_admin_and_names_each_dead_upstreams_cause(tmp_path: Path) -> None:
    """Anyone: {"ready": false}; the admin: per-upstream detail naming the connection error and the exit."""
    config: dict[str, Any] = {
        "gateway": {"upstream_timeout_s": 5.0},
        "servers": {
            "gone": {"url": f"http://127.0.0.1:{_closed_port()}/mcp"},
            "dies": {"command": sys.executable, "args": ["-c", _DIES], "timeout_s": 5.0},
        },
        "agents": {"alice": {"token_sha256": hash_token(TOKENS["alice"])}},
        "auth": auth_table(),
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path)
    )
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        origin = url.removesuffix("/mcp")
        assert (await http.get(f"{origin}/healthz")).status_code == 200
        for headers in ({}, bearer(TOKENS["alice"]), bearer("not-the-admin")):
            bare = await http.get(f"{origin}/readyz", headers=headers)
            assert bare.status_code == 503 and bare.json() == {"ready": False}
        with anyio.fail_after(WAIT_S):
            while True:
                detail = (await http.get(f"{origin}/readyz", headers=bearer(ADMIN_TOKEN))).json()
                by_name = {u["name"]: u["detail"] for u in detail["upstreams"]}
                if "boom" in (by_name["dies"] or "") and by_name["gone"] not in (None, "not started"):
                    break
                await anyio.sleep(0.05)
    assert "exited with status 3" in by_name["dies"] and "NOTES_API_KEY is not set" in by_name["dies"]
    assert "ConnectError: " in by_name["gone"], by_name
