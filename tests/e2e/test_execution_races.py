"""Concurrent collision and execution identity rules (seed 000, DESIGN section 3), end to end.

The race: 64 tasks in this process (half sessionless, half on four session-era
transport sessions) and 4 client OS processes (8 raw sessionless requests
each) release together on one gateway and send the same execution id to the
real HTTP tools upstream's ``increment``, once all with one binding and once
each with its own. Exactly one invocation reaches the upstream (its counter
moves by one); every other request is refused with the reason its binding
calls for (in flight or replay for the winner's binding, collision for any
other); and every attempt is in the audit, found by the ``call_id`` of its
receipt in the evidence session the receipt names.

Then the identity rules: the same id under two agents does not collide; a
missing id is ``null`` in the audit; ``workflow_id`` is recorded as given and
never derived from, or checked against, ``execution_id``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.admission.binding import bind_call
from bastion.app import create_app
from bastion.gateway import Gateway, RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream, counter_value, gateway_config
from tests.e2e.test_evidence_e2e import (
    auth,
    bundle_entries,
    call_params,
    export_bundle,
    reason_of,
    receipt_of,
    sessionless_call,
)
from tests.e2e.test_transport_rules import MODERN_META, modern_headers, open_session, rpc, session_headers
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

IN_PROCESS_TASKS = 64
TRANSPORT_SESSIONS = 4
CLIENT_PROCESSES = 4
REQUESTS_PER_PROCESS = 8
RACE_TIMEOUT_S = 60.0

# Each client process: connect, say READY, wait for GO on stdin, fire every request at once, print answers.
CLIENT_PROCESS = """
import asyncio, json, sys
import httpx

async def main():
    url, headers, bodies = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        await http.get(url.removesuffix("/mcp") + "/healthz")
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        answers = await asyncio.gather(*(http.post(url, headers=headers, json=b) for b in bodies))
        print(json.dumps([[a.status_code, a.json()] for a in answers]), flush=True)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so one gateway serves every case of this module."""
    return "asyncio"


@dataclass
class RaceGateway:
    url: str
    gateway: Gateway


@pytest.fixture(scope="module")
async def race_gateway(
    tmp_path_factory: pytest.TempPathFactory, tools_upstream: Upstream
) -> AsyncIterator[RaceGateway]:
    directory = tmp_path_factory.mktemp("races")
    snapshot = snapshot_from_mapping(
        gateway_config(directory, tools_upstream.url), source=None, version="races"
    )
    app = create_app(snapshot, RuntimeOptions(data_dir=directory / "data"))
    async with serve_on_loopback(app) as url:
        yield RaceGateway(url, app.state.gateway)


@dataclass(frozen=True)
class Attempt:
    """One racing request: who sent it, and with which binding."""

    origin: str  # "task", "session" or "process"
    arguments: dict[str, Any]
    answer: dict[str, Any]

    @property
    def binding(self) -> str:
        return bind_call("tools", "increment", self.arguments)[0]


async def _client_processes(
    url: str, bodies: list[list[dict[str, Any]]], go: anyio.Event, ready: list[anyio.Event]
) -> list[list[dict[str, Any]]]:
    """Run one client OS process per body list; each fires when ``go`` is set. Returns their answers."""
    headers = {**modern_headers("tools/call", "tools__increment"), **auth("alice")}
    results: list[list[dict[str, Any]]] = [[] for _ in bodies]

    async def one(index: int) -> None:
        command = [sys.executable, "-c", CLIENT_PROCESS, url, json.dumps(headers), json.dumps(bodies[index])]
        async with await anyio.open_process(command) as process:
            assert process.stdin is not None and process.stdout is not None
            stdout = BufferedByteReceiveStream(process.stdout)
            assert await stdout.receive_until(b"\n", 64) == b"READY"
            ready[index].set()
            await go.wait()
            await process.stdin.send(b"GO\n")
            answers = json.loads(await stdout.receive_until(b"\n", 1 << 22))
            assert await process.wait() == 0
        for status, answer in answers:
            assert status == 200, answer
            results[index].append(answer)

    async with anyio.create_task_group() as tg:
        for index in range(len(bodies)):
            tg.start_soon(one, index)
    return results


async def race(http: httpx.AsyncClient, url: str, execution_id: str, *, same_binding: bool) -> list[Attempt]:
    """Release every racer at once; returns each request's answer with the binding it carried."""
    numbers = iter(range(10_000))

    def arguments() -> dict[str, Any]:
        return {} if same_binding else {"attempt": next(numbers)}

    def body(args: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
        params = call_params("tools__increment", args, execution_id=execution_id, meta=meta)
        return rpc("tools/call", params, request_id=next(numbers) + 1)

    transport_sessions = [await open_session(http, url) for _ in range(TRANSPORT_SESSIONS)]
    process_args = [[arguments() for _ in range(REQUESTS_PER_PROCESS)] for _ in range(CLIENT_PROCESSES)]
    process_bodies = [[body(a, MODERN_META) for a in args] for args in process_args]
    attempts: list[Attempt] = []
    go = anyio.Event()
    ready = [anyio.Event() for _ in range(CLIENT_PROCESSES)]

    async def task(index: int) -> None:
        args = arguments()
        await go.wait()
        if index % 2:
            session = transport_sessions[index % TRANSPORT_SESSIONS]
            response = await http.post(url, headers=session_headers(session), json=body(args, None))
            kind = "session"
        else:
            headers = {**modern_headers("tools/call", "tools__increment"), **auth("alice")}
            response = await http.post(url, headers=headers, json=body(args, MODERN_META))
            kind = "task"
        assert response.status_code == 200, response.text
        attempts.append(Attempt(kind, args, response.json()))

    async def processes() -> None:
        for args, answers in zip(
            process_args, await _client_processes(url, process_bodies, go, ready), strict=True
        ):
            attempts.extend(Attempt("process", a, answer) for a, answer in zip(args, answers, strict=True))

    with anyio.fail_after(RACE_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(processes)
            for index in range(IN_PROCESS_TASKS):
                tg.start_soon(task, index)
            for event in ready:
                await event.wait()
            go.set()
        for session in transport_sessions:
            await http.delete(url, headers=session_headers(session))
    assert len(attempts) == IN_PROCESS_TASKS + CLIENT_PROCESSES * REQUESTS_PER_PROCESS
    return attempts


EXPECTED_EVENT = {
    "execution_in_flight": "refused",
    "execution_replay": "replay",
    "execution_collision": "collision",
}


@pytest.mark.parametrize("same_binding", [True, False], ids=["same-binding", "different-bindings"])
async def test_racing_one_execution_id_invokes_the_upstream_once(
    race_gateway: RaceGateway, tools_upstream: Upstream, same_binding: bool
) -> None:
    """96 racers, 5 processes, one id: one invocation, every other refused for its binding, all audited."""
    execution_id = f"race-{'same' if same_binding else 'different'}"
    counter = tools_upstream.counter_file
    limits = httpx.Limits(
        max_connections=IN_PROCESS_TASKS + 8, max_keepalive_connections=IN_PROCESS_TASKS + 8
    )
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        before = counter_value(counter)
        attempts = await race(http, race_gateway.url, execution_id, same_binding=same_binding)
        assert counter_value(counter) == before + 1

        # 1. One winner; every loser refused with the reason its binding calls for.
        winners = [a for a in attempts if "result" in a.answer]
        assert len(winners) == 1, [a.answer for a in attempts if "result" in a.answer]
        winner = winners[0]
        assert winner.answer["result"]["isError"] is False
        reasons: Counter[str] = Counter()
        for attempt in attempts:
            if attempt is winner:
                continue
            reason = reason_of(attempt.answer)
            assert reason is not None
            reasons[reason] += 1
            if attempt.binding == winner.binding:
                assert reason in ("execution_in_flight", "execution_replay"), attempt.answer
            else:
                assert reason == "execution_collision", attempt.answer
            assert attempt.answer["error"]["data"]["execution_id"] == execution_id
        if not same_binding:
            assert reasons == {"execution_collision": len(attempts) - 1}
        assert {a.origin for a in attempts} == {"task", "session", "process"}

        # 2. Every attempt is in the audit, by its receipt: the winner admitted once, each loser refused once.
        chains: dict[str, list[dict[str, Any]]] = {}
        for attempt in attempts:
            receipt = receipt_of(attempt.answer)
            assert receipt["execution_id"] == execution_id
            session_id = receipt["evidence_session_id"]
            if session_id not in chains:
                chains[session_id] = bundle_entries(await export_bundle(http, race_gateway.url, session_id))
            mine = [e for e in chains[session_id] if e["call_id"] == receipt["call_id"]]
            assert mine[-1]["hash"] == receipt["entry_hash"]
            assert {e["execution_id"] for e in mine} == {execution_id}
            if attempt is winner:
                assert [e["event"] for e in mine] == ["admitted", "invoking", "completed"]
            else:
                reason = reason_of(attempt.answer)
                assert [(e["event"], e["reason"], e["decision"]) for e in mine] == [
                    (EXPECTED_EVENT[str(reason)], reason, "deny")
                ]
                assert mine[0]["binding"] == attempt.binding
        everything = [e for chain in chains.values() for e in chain if e["execution_id"] == execution_id]
        events = Counter(e["event"] for e in everything)
        assert events["admitted"] == 1
        assert events["invoking"] == 1
        assert events["refused"] + events["replay"] + events["collision"] == len(attempts) - 1
        assert len({e["call_id"] for e in everything}) == len(attempts)


async def test_same_execution_id_under_two_agents_does_not_collide(
    race_gateway: RaceGateway, tools_upstream: Upstream
) -> None:
    """Alice and Bob race one id value: each agent's key is its own, so each invokes exactly once."""
    counter = tools_upstream.counter_file
    before = counter_value(counter)
    answers: dict[str, list[dict[str, Any]]] = {"alice": [], "bob": []}
    async with httpx.AsyncClient(timeout=30) as http:
        go = anyio.Event()

        async def one(agent: str) -> None:
            await go.wait()
            answers[agent].append(
                await sessionless_call(
                    http, race_gateway.url, "tools__increment", agent=agent, execution_id="shared"
                )
            )

        with anyio.fail_after(RACE_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                for index in range(16):
                    tg.start_soon(one, "alice" if index % 2 else "bob")
                go.set()
    assert counter_value(counter) == before + 2
    for agent, mine in answers.items():
        assert len([a for a in mine if "result" in a]) == 1, agent
        refusals = {reason_of(a) for a in mine if "error" in a}
        assert refusals <= {"execution_in_flight", "execution_replay"}, agent
    assert set(answers) == set(TOKENS)


async def test_missing_execution_id_is_null_in_the_audit(
    race_gateway: RaceGateway, tools_upstream: Upstream
) -> None:
    """Without an execution id a call is legal, unprotected, and its entries say ``execution_id: null``."""
    counter = tools_upstream.counter_file
    before = counter_value(counter)
    async with httpx.AsyncClient(timeout=30) as http:
        plain = await sessionless_call(http, race_gateway.url, "tools__increment")
        again = await sessionless_call(http, race_gateway.url, "tools__increment")
        workflow_only = await sessionless_call(
            http, race_gateway.url, "tools__increment", workflow_id="wf-null"
        )
        assert counter_value(counter) == before + 3  # nothing to replay against: each call runs
        for answer, workflow in ((plain, None), (again, None), (workflow_only, "wf-null")):
            receipt = receipt_of(answer)
            assert receipt["execution_id"] is None
            bundle = await export_bundle(http, race_gateway.url, receipt["evidence_session_id"])
            # The chain is shared with the agent's other requests: judge this call's own lines.
            lines = [line for line in bundle.splitlines() if receipt["call_id"].encode() in line]
            assert lines and all(b'"execution_id":null' in line for line in lines)
            assert not any(b'"execution_id":"' in line for line in lines)  # nothing synthesized
            mine = [e for e in bundle_entries(bundle) if e["call_id"] == receipt["call_id"]]
            # An invoking entry is optional here: there is no execution row to mark.
            assert [e["event"] for e in mine if e["event"] != "invoking"] == ["admitted", "completed"]
            assert all("execution_id" in e and e["execution_id"] is None for e in mine)
            assert {e["workflow_id"] for e in mine} == {workflow}


async def test_workflow_id_is_never_derived_from_or_checked_against_execution_id(
    race_gateway: RaceGateway, tools_upstream: Upstream
) -> None:
    """One workflow with two ids runs twice; one id under two workflows is judged on its binding alone."""
    url = race_gateway.url
    counter = tools_upstream.counter_file
    before = counter_value(counter)
    async with httpx.AsyncClient(timeout=30) as http:
        # 1. The same workflow_id with different execution_ids: two executions, both run.
        first = await sessionless_call(
            http, url, "tools__increment", execution_id="wf-x-1", workflow_id="wf-x"
        )
        second = await sessionless_call(
            http, url, "tools__increment", execution_id="wf-x-2", workflow_id="wf-x"
        )
        assert "result" in first and "result" in second
        assert counter_value(counter) == before + 2

        # 2. The same execution_id under another workflow_id: a replay (same binding) or a collision (other).
        replay = await sessionless_call(
            http, url, "tools__increment", execution_id="wf-x-1", workflow_id="wf-y"
        )
        collision = await sessionless_call(
            http, url, "tools__echo", {"text": "x"}, execution_id="wf-x-1", workflow_id="wf-x"
        )
        no_workflow = await sessionless_call(http, url, "tools__increment", execution_id="wf-x-2")
        assert reason_of(replay) == "execution_replay"
        assert reason_of(collision) == "execution_collision"
        assert reason_of(no_workflow) == "execution_replay"
        assert counter_value(counter) == before + 2

        # 3. A workflow_id equal to an admitted execution_id, and the reverse, are just strings.
        echoed = await sessionless_call(
            http, url, "tools__echo", {"text": "y"}, execution_id="wf-x", workflow_id="wf-x-1"
        )
        assert "result" in echoed

        # 4. Each entry records the ids exactly as that request gave them.
        expected = [
            (first, "wf-x-1", "wf-x", "completed"),
            (second, "wf-x-2", "wf-x", "completed"),
            (replay, "wf-x-1", "wf-y", "replay"),
            (collision, "wf-x-1", "wf-x", "collision"),
            (no_workflow, "wf-x-2", None, "replay"),
            (echoed, "wf-x", "wf-x-1", "completed"),
        ]
        for answer, execution_id, workflow_id, last_event in expected:
            receipt = receipt_of(answer)
            entries = bundle_entries(await export_bundle(http, url, receipt["evidence_session_id"]))
            mine = [e for e in entries if e["call_id"] == receipt["call_id"]]
            assert {(e["execution_id"], e["workflow_id"]) for e in mine} == {(execution_id, workflow_id)}
            assert mine[-1]["event"] == last_event


async def test_execution_ids_hold_with_the_audit_turned_off(tmp_path: Path, tools_upstream: Upstream) -> None:
    """With ``--unsafe-no-audit`` an execution id still reserves, runs once, and refuses its replay."""
    snapshot = snapshot_from_mapping(gateway_config(tmp_path, tools_upstream.url), source=None, version="off")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data", unsafe_no_audit=True))
    counter = tools_upstream.counter_file
    before = counter_value(counter)
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        first = await sessionless_call(http, url, "tools__increment", execution_id="off-1")
        assert "result" in first, first
        again = await sessionless_call(http, url, "tools__increment", execution_id="off-1")
        assert reason_of(again) == "execution_replay"
    assert counter_value(counter) == before + 1
