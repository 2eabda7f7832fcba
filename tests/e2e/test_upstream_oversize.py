"""An upstream message past the server's bound ends its call, typed and audited (issue #13 hardening).

A real upstream process answers with a JSON body, an SSE event or a stdio line that never
ends. The gateway stops reading at ``servers.NAME.max_response_bytes``, drops that
connection (a stdio upstream: its process, which is started again), and the call ends as
every failure after the send ends: ``upstream_response_too_large`` to the client, the
execution row ``outcome_unknown``, an audit entry. The next call on the same session works.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from bastion.admission.states import ExecutionState
from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.ids import AgentId, ExecutionId
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, RunningGateway
from tests.e2e.test_evidence_e2e import receipt_of, sessionless_call
from tests.e2e.test_execution_restart import entries_with
from tests.e2e.upstream_support import listening_upstream, text_of
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

LIMIT = 65_536
UPSTREAM = [sys.executable, "-m", "tests.e2e.oversize_upstream"]
ENDLESS = [
    "web__endless_json",  # sessionless era
    "web__endless_sse",
    "sess__endless_json",  # session era: the call's upstream session outlives the dropped connection
    "sess__endless_sse",
    "pipe__endless_line",  # stdio
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so one gateway serves every case of this module."""
    return "asyncio"


@pytest.fixture(scope="module")
async def oversize_gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningGateway]:
    directory = tmp_path_factory.mktemp("oversize")
    with listening_upstream([*UPSTREAM, "http"]) as upstream_url:
        config = {
            "gateway": {"upstream_timeout_s": 30.0},
            "servers": {
                "web": {"url": upstream_url, "era": "sessionless", "max_response_bytes": LIMIT},
                "sess": {"url": upstream_url, "era": "session", "max_response_bytes": LIMIT},
                "pipe": {
                    "command": UPSTREAM[0],
                    "args": [*UPSTREAM[1:], "stdio"],
                    "max_response_bytes": LIMIT,
                },
            },
            "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
        }
        app = create_app(
            snapshot_from_mapping(config, source=None, version="oversize"), RuntimeOptions(directory / "data")
        )
        async with serve_on_loopback(app) as url:
            yield RunningGateway(url, app.state.gateway, directory)


@pytest.mark.parametrize("tool", ENDLESS)
async def test_an_endless_answer_ends_the_call_terminal_and_audited(
    oversize_gateway: RunningGateway, tool: str
) -> None:
    """Past the bound: upstream_response_too_large, row outcome_unknown, audited; the next call works."""
    execution_id = f"oversize-{tool}"
    async with httpx.AsyncClient(timeout=60) as http:
        with anyio.fail_after(20):
            answer = await sessionless_call(http, oversize_gateway.url, tool, execution_id=execution_id)
        assert "error" in answer, str(answer)[:300]
        assert answer["error"]["data"]["reason"] == "upstream_response_too_large", answer
        assert answer["error"]["data"]["limit_bytes"] == LIMIT
        assert receipt_of(answer)["execution_id"] == execution_id
        store = oversize_gateway.gateway.store
        assert store is not None
        record = await store.get_execution(AgentId("alice"), ExecutionId(execution_id))
        assert record is not None and record.state is ExecutionState.OUTCOME_UNKNOWN
        entries = entries_with(oversize_gateway.gateway.options.data_dir, execution_id)
        assert entries[-1]["outcome"] == "outcome_unknown"
        assert "upstream_response_too_large" in str(entries[-1])
        with anyio.fail_after(20):
            after = await sessionless_call(http, oversize_gateway.url, tool.split("__")[0] + "__echo")
    assert after["result"]["content"][0]["text"] == "ok", after


async def test_the_official_client_gets_the_typed_error_and_its_session_goes_on(
    oversize_gateway: RunningGateway,
) -> None:
    """Through the SDK client (session era): each endless answer is an MCP error with the reason; the
    same client session's next calls are answered."""
    async with oversize_gateway.client() as client:
        for tool in ENDLESS:
            with anyio.fail_after(20), pytest.raises(MCPError) as caught:
                await client.session.call_tool(tool, {})
            assert caught.value.error.data["reason"] == "upstream_response_too_large", tool
            with anyio.fail_after(20):
                result = await client.session.call_tool(tool.split("__")[0] + "__echo", {})
            assert text_of(result) == "ok", tool
