"""Replay after each terminal outcome (seed 000, DESIGN section 3): refused, with no window, joinable offline.

One gateway (upstream timeout 1 s) in front of the real HTTP tools upstream.
For each terminal outcome (``completed`` by ``increment``, ``failed`` by the
``isError`` tool, ``outcome_unknown`` by a timeout after send and by a client
that cancels after send), the same execution id with the same binding is
refused as ``execution_replay`` naming that outcome, again and again, without
touching the upstream; the refusal is an audit entry in its own evidence
session, and ``bastion audit join`` lists both attempts in order across the
two verified bundles.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bastion.admission.states import ExecutionState
from bastion.app import create_app
from bastion.cli.verify_cmd import EXIT_OK, run_join
from bastion.gateway import Gateway, RuntimeOptions
from bastion.ids import AgentId, ExecutionId
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import SESSIONLESS_MAX_AGE_S, Upstream, counter_value, gateway_config
from tests.e2e.test_evidence_e2e import (
    bundle_entries,
    call_params,
    reason_of,
    receipt_of,
    save_evidence,
    sessionless_call,
    verify_quietly,
    write_public_key,
)
from tests.e2e.test_execution_restart import entries_with
from tests.e2e.test_transport_rules import MODERN_META, modern_headers, rpc
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so one gateway serves every case of this module."""
    return "asyncio"


@dataclass
class ReplayGateway:
    url: str
    gateway: Gateway
    key: Path
    directory: Path

    async def state(self, execution_id: str) -> ExecutionState | None:
        assert self.gateway.store is not None
        record = await self.gateway.store.get_execution(AgentId("alice"), ExecutionId(execution_id))
        return None if record is None else record.state


@pytest.fixture(scope="module")
async def replay_gateway(
    tmp_path_factory: pytest.TempPathFactory, tools_upstream: Upstream
) -> AsyncIterator[ReplayGateway]:
    directory = tmp_path_factory.mktemp("replay")
    config = gateway_config(directory, tools_upstream.url, timeout_s=1.0)
    snapshot = snapshot_from_mapping(config, source=None, version="replay")
    options = RuntimeOptions(
        data_dir=directory / "data", sessionless_evidence_max_age_s=SESSIONLESS_MAX_AGE_S
    )
    app = create_app(snapshot, options)
    async with serve_on_loopback(app) as url:
        key = write_public_key(directory / "data", directory / "gateway.pem")
        yield ReplayGateway(url, app.state.gateway, key, directory)


async def cancel_after_send(http: httpx.AsyncClient, gw: ReplayGateway, execution_id: str) -> None:
    """Start a slow call and close its stream once the row is ``invoking``; wait for its outcome."""
    params = call_params(
        "tools__slow", {"seconds": 30, "steps": 2}, execution_id=execution_id, meta=MODERN_META
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: http.post(
                    gw.url,
                    headers=modern_headers("tools/call", "tools__slow"),
                    json=rpc("tools/call", params),
                )
            )
            while await gw.state(execution_id) is not ExecutionState.INVOKING:
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()  # the client goes away after the call was sent
        while await gw.state(execution_id) is ExecutionState.INVOKING:
            await anyio.sleep(0.02)


@dataclass(frozen=True)
class Case:
    name: str
    tool: str
    arguments: dict[str, Any]
    outcome: ExecutionState
    outcome_reason: str | None  # the reason the outcome entry records


CASES = [
    pytest.param(Case("completed", "tools__increment", {}, ExecutionState.COMPLETED, None), id="completed"),
    pytest.param(Case("failed", "tools__fail", {}, ExecutionState.FAILED, None), id="failed"),
    pytest.param(
        Case("timeout", "tools__hang", {}, ExecutionState.OUTCOME_UNKNOWN, "upstream_timeout"),
        id="outcome_unknown-timeout",
    ),
    pytest.param(
        Case(
            "cancelled",
            "tools__slow",
            {"seconds": 30, "steps": 2},
            ExecutionState.OUTCOME_UNKNOWN,
            "cancelled",
        ),
        id="outcome_unknown-cancelled",
    ),
]


@pytest.mark.parametrize("case", CASES)
async def test_replay_is_refused_forever_and_joins_the_first_attempt(
    replay_gateway: ReplayGateway, tools_upstream: Upstream, case: Case
) -> None:
    """Same id and binding after a terminal outcome: a replay naming it, every time, joinable offline."""
    gw = replay_gateway
    execution_id = f"replay-{case.name}"
    counter = tools_upstream.counter_file
    async with httpx.AsyncClient(timeout=30) as http:
        # 1. The first attempt reaches its terminal outcome.
        before = counter_value(counter)
        if case.name == "cancelled":
            await cancel_after_send(http, gw, execution_id)
            first_session = None
        else:
            first = await sessionless_call(
                http, gw.url, case.tool, case.arguments, execution_id=execution_id, workflow_id="wf-replay"
            )
            first_session = receipt_of(first)["evidence_session_id"]
            if case.outcome is ExecutionState.OUTCOME_UNKNOWN:
                assert reason_of(first) == case.outcome_reason, first
            else:
                assert first["result"]["isError"] is (case.outcome is ExecutionState.FAILED), first
        assert await gw.state(execution_id) is case.outcome
        ran = counter_value(counter) - before
        assert ran == (1 if case.name == "completed" else 0)

        # 2. Every later attempt is a replay that names the earlier outcome: no window, no upstream call.
        replays = []
        for _ in range(3):
            answer = await sessionless_call(
                http, gw.url, case.tool, case.arguments, execution_id=execution_id, workflow_id="wf-replay"
            )
            assert reason_of(answer) == "execution_replay", answer
            assert answer["error"]["data"]["earlier_outcome"] == case.outcome.value
            assert answer["error"]["data"]["execution_id"] == execution_id
            assert receipt_of(answer)["execution_id"] == execution_id
            assert receipt_of(answer)["entry_hash"] is not None
            # It names the earlier attempt: its call and the entry that recorded its outcome.
            earlier = answer["error"]["data"]
            if first_session is not None:
                assert earlier["earlier_evidence_session_id"] == first_session
                assert earlier["earlier_call_id"] == receipt_of(first)["call_id"]
                assert earlier["earlier_entry_hash"] == receipt_of(first)["entry_hash"]
            else:
                assert earlier["earlier_evidence_session_id"] is not None and earlier["earlier_seq"] > 1
            replays.append(receipt_of(answer)["evidence_session_id"])
        assert counter_value(counter) - before == ran
        assert await gw.state(execution_id) is case.outcome

        # 3. Every evidence session holding the attempts (one shared chain, or more once it rotated)
        #    verifies offline with its claim.
        entries = entries_with(gw.directory / "data", execution_id)
        if first_session is None:  # the cancelled request's receipt never reached the client
            first_session = next(e["session_id"] for e in entries if e["event"] == "admitted")
        saved = {
            session_id: await save_evidence(http, gw.url, session_id, gw.directory)
            for session_id in sorted({e["session_id"] for e in entries})
        }
    first_bundle = saved[first_session][0]
    outcome_entries = [
        e
        for e in bundle_entries(first_bundle.read_bytes())
        if e["event"] == case.outcome.value and e["execution_id"] == execution_id
    ]
    assert [(e["reason"], e["workflow_id"]) for e in outcome_entries] == [
        (case.outcome_reason, None if case.name == "cancelled" else "wf-replay")
    ]
    for bundle, claim in saved.values():
        code, output = verify_quietly(bundle, claim, gw.key)
        assert code == EXIT_OK, output

    # 4. `bastion audit join` lists the first attempt's records, then the replays, by execution id.
    out, err = io.StringIO(), io.StringIO()
    bundles = [bundle for bundle, _ in saved.values()]
    assert run_join(execution_id, bundles, out=out, err=err) == EXIT_OK, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        f"6 record(s) carry the asserted execution_id {execution_id!r} in {len(saved)} evidence session(s)"
    )
    records = [_fields(line) for line in lines[1:] if "event=" in line]
    assert [r["event"] for r in records] == ["admitted", "invoking", case.outcome.value] + ["replay"] * 3
    assert [r["session"] for r in records] == [first_session] * 3 + replays
    assert records[2]["outcome"] == case.outcome.value
    assert all(r["outcome"] == case.outcome.value for r in records[3:])  # each names the earlier outcome
    assert len({r["binding"] for r in records}) == 1  # one binding: retries, not another operation
    assert records[0]["call"] != records[3]["call"]  # two attempts
    assert "bindings differ" not in out.getvalue()


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)
