"""An upstream that drops a call fails it at once, not at the timeout (issue 12 point 4).

The upstream accepts ``tools/call`` and closes its response stream without an
answer; in the session era it offers resumption, and every resumed stream ends
empty too. The call must end long before the (60 s) upstream timeout with a
typed ``outcome_unknown`` (the upstream may have acted), its execution row
terminal and audited. So must a call whose stdio upstream exits mid-call.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bastion.admission.states import ExecutionState
from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import Gateway, RuntimeOptions
from bastion.ids import AgentId, ExecutionId
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream, gateway_config
from tests.e2e.dropping_upstream import DroppingUpstream
from tests.e2e.test_evidence_e2e import receipt_of, sessionless_call
from tests.e2e.test_execution_restart import entries_with
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

TIMEOUT_S = 60.0
BOUND_S = 15.0  # far below the timeout: the drop is detected, not waited out


@contextlib.asynccontextmanager
async def lossy_gateway(data_dir: Path, era: str) -> AsyncIterator[tuple[DroppingUpstream, str, Gateway]]:
    """A dropping upstream pinned to ``era`` behind a real gateway: it, the gateway's URL, the gateway."""
    upstream = DroppingUpstream()
    async with serve_on_loopback(upstream.app) as upstream_url:
        config = {
            "gateway": {"upstream_timeout_s": TIMEOUT_S},
            "servers": {"lossy": {"url": upstream_url, "era": era}},
            "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
        }
        app = create_app(
            snapshot_from_mapping(config, source=None, version="drops"), RuntimeOptions(data_dir)
        )
        async with serve_on_loopback(app) as url:
            yield upstream, url, app.state.gateway


async def call_within_bound(
    url: str, gateway: Gateway, tool: str, execution_id: str
) -> tuple[dict[str, Any], ExecutionState | None, str | None]:
    """One sessionless call with ``execution_id``, bounded far below the timeout.

    Returns the answer, the execution row's state and the last audit outcome naming it.
    """
    async with httpx.AsyncClient(timeout=TIMEOUT_S * 2) as http:
        with anyio.fail_after(BOUND_S):
            answer = await sessionless_call(http, url, tool, execution_id=execution_id)
    assert gateway.store is not None
    record = await gateway.store.get_execution(AgentId("alice"), ExecutionId(execution_id))
    outcomes = [e["outcome"] for e in entries_with(gateway.options.data_dir, execution_id)]
    return answer, None if record is None else record.state, outcomes[-1] if outcomes else None


@pytest.mark.parametrize("era", ["sessionless", "session"])
async def test_a_dropped_call_fails_at_once_as_outcome_unknown(tmp_path: Path, era: str) -> None:
    """A stream closed without the answer ends the call at once: outcome_unknown, row terminal, audited."""
    async with lossy_gateway(tmp_path / "data", era) as (upstream, url, gateway):
        answer, state, outcome = await call_within_bound(url, gateway, "lossy__drop", f"dropped-{era}")
    assert upstream.calls == ["drop"]
    assert answer["error"]["data"]["reason"] == "outcome_unknown", answer
    assert receipt_of(answer)["execution_id"] == f"dropped-{era}"
    assert (state, outcome) == (ExecutionState.OUTCOME_UNKNOWN, "outcome_unknown")
    if era == "session":
        resumed = [last for last in upstream.resumes if last]  # "" is the standalone GET stream
        assert resumed and set(resumed) == {"e1"} and len(resumed) <= 4  # resumption tried, bounded


async def test_a_call_answered_202_fails_at_once(tmp_path: Path) -> None:
    """A tools/call the upstream answers 202 (no body, no stream) ends at once as a typed upstream error."""
    async with lossy_gateway(tmp_path / "data", "sessionless") as (upstream, url, gateway):
        answer, state, outcome = await call_within_bound(url, gateway, "lossy__accept", "accepted-only")
    assert upstream.calls == ["accept"]
    assert answer["error"]["data"]["reason"] == "upstream_protocol_error", answer
    assert (state, outcome) == (ExecutionState.OUTCOME_UNKNOWN, "outcome_unknown")


async def test_a_stdio_upstream_that_exits_mid_call_fails_it_at_once(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A stdio upstream exiting mid-call ends the call at once: outcome_unknown, row terminal, audited."""
    config = gateway_config(tmp_path, tools_upstream.url, timeout_s=TIMEOUT_S)
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        answer, state, outcome = await call_within_bound(url, app.state.gateway, "notes__crash", "exited")
    assert answer["error"]["data"]["reason"] == "outcome_unknown", answer
    assert (state, outcome) == (ExecutionState.OUTCOME_UNKNOWN, "outcome_unknown")
