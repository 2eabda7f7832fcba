"""An upstream that acts, then answers garbage (issue #12 points 5 and 6).

NaN, Infinity, lone surrogates, nesting too deep to walk, integers with no
canonical form, a ``_meta`` that is not an object, a result that is not an
object: each reaches the gateway after the call was sent. Each call must end
with a typed upstream error naming the problem, a terminal ``outcome_unknown``
row for its execution id and an audit entry saying so: never an HTTP 500, never
a row left ``invoking``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import orjson
import pytest
from mcp.shared.exceptions import MCPError

from bastion.admission.states import ExecutionState
from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import Gateway, RuntimeOptions
from bastion.ids import AgentId, ExecutionId
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, RunningGateway
from tests.e2e.garbage_upstream import GARBAGE, GARBAGE_ERRORS, GarbageUpstream
from tests.e2e.test_evidence_e2e import receipt_of, sessionless_call
from tests.e2e.test_execution_restart import entries_with
from tests.e2e.test_transport_rules import MODERN_META, modern_headers
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so one gateway serves every case of this module."""
    return "asyncio"


@dataclass
class GarbageGateway:
    url: str
    gateway: Gateway
    upstream: GarbageUpstream
    data_dir: Path


@pytest.fixture(scope="module")
async def garbage_gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GarbageGateway]:
    directory = tmp_path_factory.mktemp("garbage")
    upstream = GarbageUpstream()
    async with serve_on_loopback(upstream.app) as upstream_url:
        config = {
            "gateway": {"upstream_timeout_s": 10.0},
            "servers": {"junk": {"url": upstream_url, "era": "sessionless"}},
            "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
        }
        snapshot = snapshot_from_mapping(config, source=None, version="garbage")
        app = create_app(snapshot, RuntimeOptions(data_dir=directory / "data"))
        async with serve_on_loopback(app) as url:
            yield GarbageGateway(url, app.state.gateway, upstream, directory / "data")


@pytest.mark.parametrize("defect", sorted(GARBAGE))
async def test_garbage_after_send_ends_terminal_and_audited(
    garbage_gateway: GarbageGateway, defect: str
) -> None:
    """A garbage result after the send: typed upstream error with a problem, row outcome_unknown, audited."""
    execution_id = f"garbage-{defect}"
    async with httpx.AsyncClient(timeout=30) as http:
        with anyio.fail_after(20):
            answer = await sessionless_call(
                http, garbage_gateway.url, f"junk__{defect}", execution_id=execution_id
            )
    assert defect in garbage_gateway.upstream.calls  # the upstream was reached: it may have acted
    assert "error" in answer, str(answer)[:300]
    error = answer["error"]
    assert error["data"]["reason"] == "upstream_protocol_error", answer
    if defect != "not_object":  # the reader itself refuses a non-object result, before the check
        assert error["data"]["problem"]
    assert receipt_of(answer)["execution_id"] == execution_id
    store = garbage_gateway.gateway.store
    assert store is not None
    record = await store.get_execution(AgentId("alice"), ExecutionId(execution_id))
    assert record is not None and record.state is ExecutionState.OUTCOME_UNKNOWN
    outcomes = [e["outcome"] for e in entries_with(garbage_gateway.data_dir, execution_id)]
    assert outcomes[-1] == "outcome_unknown"


@pytest.mark.parametrize("defect", sorted(GARBAGE_ERRORS))
async def test_an_upstream_error_that_cannot_cross_ends_terminal_and_audited(
    garbage_gateway: GarbageGateway, defect: str
) -> None:
    """An upstream JSON-RPC error holding NaN, a lone surrogate or deep nesting is not relayed: typed
    upstream_protocol_error naming the problem, row outcome_unknown, audited."""
    execution_id = f"garbage-{defect}"
    async with httpx.AsyncClient(timeout=30) as http:
        with anyio.fail_after(20):
            answer = await sessionless_call(
                http, garbage_gateway.url, f"junk__{defect}", execution_id=execution_id
            )
    assert defect in garbage_gateway.upstream.calls
    error = answer["error"]
    assert error["data"]["reason"] == "upstream_protocol_error", answer
    assert error["data"]["problem"] in ("not_finite", "lone_surrogate", "too_deep"), answer
    store = garbage_gateway.gateway.store
    assert store is not None
    record = await store.get_execution(AgentId("alice"), ExecutionId(execution_id))
    assert record is not None and record.state is ExecutionState.OUTCOME_UNKNOWN
    outcomes = [e["outcome"] for e in entries_with(garbage_gateway.data_dir, execution_id)]
    assert outcomes[-1] == "outcome_unknown"


async def test_garbage_reaches_a_session_era_client_as_a_typed_error(
    garbage_gateway: GarbageGateway,
) -> None:
    """Through the official client (session era), each defect is an MCP error with a reason, never a 500."""
    running = RunningGateway(garbage_gateway.url, garbage_gateway.gateway, garbage_gateway.data_dir)
    async with running.client() as client:
        for defect in sorted(GARBAGE):
            with anyio.fail_after(20), pytest.raises(MCPError) as caught:
                await client.session.call_tool(f"junk__{defect}", {})
            assert caught.value.error.data["reason"] == "upstream_protocol_error", defect


@pytest.mark.parametrize(
    "params",
    [
        b'{"name":"junk__nan","arguments":{},"extra":NaN,"_meta":META}',
        b'{"name":"junk__\\ud800","arguments":{},"_meta":META}',
        b'{"name":"junk__nan","arguments":{},"_meta":"not an object"}',
    ],
)
async def test_client_values_that_cannot_cross_are_refused_before_the_upstream(
    garbage_gateway: GarbageGateway, params: bytes
) -> None:
    """NaN outside arguments, a surrogate tool name, a non-object _meta: 400 invalid_request, nothing sent."""
    body = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":' + params + b"}"
    body = body.replace(b"META", orjson.dumps(MODERN_META))
    before = len(garbage_gateway.upstream.calls)
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            garbage_gateway.url,
            headers={**modern_headers("tools/call", "junk__nan"), "content-type": "application/json"},
            content=body,
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["data"]["reason"] == "invalid_request"
    assert len(garbage_gateway.upstream.calls) == before
