"""Process restart (seed 000, DESIGN section 3): ``kill -9`` the gateway at each durable step, then recover.

Each case runs the gateway as a real subprocess (``tests.support.crash_gateway``)
on a fresh data dir, in front of a fresh HTTP tools upstream whose
``increment`` tool counts its invocations. The first process kills itself
(SIGKILL) at one step of one execution; the second, started on the same data
dir, takes the dead generation over (short lease) and recovers it. After
recovery the row is in the state DESIGN section 3 names, with an audit entry
written under the new epoch; the same execution id is then refused every time
(or, after a release, admitted once more and never again); the counter moved
at most once; every chain the dead worker left open is closed with a claim.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import orjson
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.admission.states import ExecutionState
from bastion.auth.bearer import hash_token
from bastion.cli.verify_cmd import EXIT_OK
from bastion.ids import AgentId, ExecutionId
from bastion.store.sqlite import SqliteStore
from tests.e2e.conftest import TOKENS, Upstream, counter_value
from tests.e2e.test_evidence_e2e import (
    reason_of,
    receipt_of,
    save_evidence,
    sessionless_call,
    verify_quietly,
    write_public_key,
)
from tests.support.crash_store import CrashingStore, parse_kill_point

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 10.0


def write_config(path: Path, tools_url: str) -> Path:
    """A TOML configuration with the HTTP tools upstream only (no stdio child to orphan on SIGKILL)."""
    agents = "".join(
        f'[agents.{name}]\ntoken_sha256 = "{hash_token(token)}"\n' for name, token in TOKENS.items()
    )
    path.write_text(
        f'[gateway]\nupstream_timeout_s = 10.0\n\n[servers.tools]\nurl = "{tools_url}"\n\n{agents}'
    )
    return path


@dataclass
class GatewayProcess:
    process: anyio.abc.Process
    url: str


@contextlib.asynccontextmanager
async def gateway_process(
    config: Path, data_dir: Path, log: Path, *extra: str
) -> AsyncIterator[GatewayProcess]:
    """Run ``tests.support.crash_gateway`` until it prints ``BASTION READY <url>``; stop it on exit."""
    command = [
        sys.executable,
        "-m",
        "tests.support.crash_gateway",
        "--config",
        str(config),
        "--data-dir",
        str(data_dir),
        "--port",
        "0",
        "--lease-s",
        "1",
        "--sessionless-evidence-max-age-s",
        "0.5",  # the live gateway's shared chain closes (claim issued) soon after its calls
        *extra,
    ]
    with log.open("ab") as stderr:
        # ``python -m tests.support...`` finds the tests package from the repository root.
        process = await anyio.open_process(command, stderr=stderr, cwd=REPO)
    try:
        assert process.stdout is not None
        with anyio.fail_after(START_TIMEOUT_S):
            try:
                line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                pytest.fail(f"the gateway exited before it was ready:\n{log.read_text()}")
        words = line.decode().split()
        assert words[:2] == ["BASTION", "READY"], line
        yield GatewayProcess(process, words[2])
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
            await process.aclose()


async def execution_state(
    data_dir: Path, execution_id: str, agent: str = "alice", *, after_restart: bool = False
) -> ExecutionState | None:
    """The committed row's state, read straight from the store file.

    ``after_restart``: no call served yet by the restarted gateway, so no chain may be open at all.
    """
    store = await SqliteStore.open(data_dir / "bastion.db")
    try:
        record = await store.get_execution(AgentId(agent), ExecutionId(execution_id))
        open_chains = await store.list_open_chains()
    finally:
        await store.aclose()
    if after_restart:
        assert open_chains == [], "every chain the dead worker left open is closed by recovery"
    return None if record is None else record.state


def entries_with(data_dir: Path, execution_id: str) -> list[dict[str, Any]]:
    """Every audit entry that carries ``execution_id``, across chains, by time.

    The store contract has no "list chains" read, and recovery's entries sit in
    chains no receipt names, so this reads the SQLite file directly (read-only).
    """
    uri = f"file:{data_dir / 'bastion.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute(
            "SELECT entry FROM entries WHERE json_extract(entry, '$.execution_id') = ?", (execution_id,)
        ).fetchall()
    entries = [orjson.loads(row[0]) for row in rows]
    return sorted(entries, key=lambda e: (e["ts"], e["session_id"], e["seq"]))


@dataclass(frozen=True)
class KillPoint:
    kill_after: str
    recovered: ExecutionState  # the row's state after recovery (DESIGN section 3)
    upstream_ran: bool  # whether the dead gateway had sent the call
    dead_audit: tuple[tuple[str, ...], ...]  # what the dead worker's chain may say about the execution


KILL_POINTS = [
    # The reservation is written with the invoking mark and their entries (store/base.py
    # ExecutionStep): a kill right after it finds the row invoking, as after-invoking does.
    pytest.param(
        KillPoint("reserve_execution", ExecutionState.OUTCOME_UNKNOWN, False, (("admitted", "invoking"),)),
        id="after-reserve",
    ),
    # The invoking mark and its audit entries are one write: durable together.
    pytest.param(
        KillPoint("mark_invoking", ExecutionState.OUTCOME_UNKNOWN, False, (("admitted", "invoking"),)),
        id="after-invoking",
    ),
    pytest.param(
        KillPoint("before:record_outcome", ExecutionState.OUTCOME_UNKNOWN, True, (("admitted", "invoking"),)),
        id="before-terminal",
    ),
    # The terminal row and its audit entry are one write: a kill right after it leaves both durable,
    # so the dead worker's chain ends with the outcome (it once lacked it).
    pytest.param(
        KillPoint("record_outcome", ExecutionState.COMPLETED, True, (("admitted", "invoking", "completed"),)),
        id="after-terminal",
    ),
]


@pytest.mark.parametrize("point", KILL_POINTS)
async def test_restart_after_kill_settles_the_execution(
    tmp_path: Path, fresh_tools_upstream: Upstream, point: KillPoint
) -> None:
    """After kill -9 at this step and a restart, the row is as DESIGN §3 names and the id is never re-run."""
    config = write_config(tmp_path / "gateway.toml", fresh_tools_upstream.url)
    data_dir = tmp_path / "data"
    counter = fresh_tools_upstream.counter_file
    execution_id = f"restart-{point.kill_after.replace(':', '-')}"
    log = tmp_path / "gateway.log"

    async with httpx.AsyncClient(timeout=20) as http:
        # 1. The first gateway dies at the kill point, without answering.
        async with gateway_process(config, data_dir, log, "--kill-after", point.kill_after) as first:
            with pytest.raises(httpx.TransportError):
                await sessionless_call(http, first.url, "tools__increment", execution_id=execution_id)
            with anyio.fail_after(KILL_TIMEOUT_S):
                assert await first.process.wait() == -signal.SIGKILL
        assert counter_value(counter) == int(point.upstream_ran)

        # 2. The restart takes the generation over and recovers before it serves.
        async with gateway_process(config, data_dir, log) as second:
            assert await execution_state(data_dir, execution_id, after_restart=True) is point.recovered
            audit = entries_with(data_dir, execution_id)
            assert tuple(e["event"] for e in audit if e["epoch"] == 1) in point.dead_audit
            recovery = [e for e in audit if e["epoch"] == 2]
            if point.recovered is ExecutionState.COMPLETED:
                assert recovery == []  # nothing to settle
            else:
                assert [(e["event"], e["outcome"], e["reason"]) for e in recovery] == [
                    (point.recovered.value, point.recovered.value, "recovery")
                ]
                previous = "reserved" if point.recovered is ExecutionState.RELEASED else "invoking"
                assert recovery[0]["detail"]["previous_state"] == previous
                # It links to the dead worker's last entry of the call; its ts is the last known event time.
                dead = [e for e in audit if e["epoch"] == 1 and e["call_id"] == recovery[0]["call_id"]]
                expected = {k: dead[-1][k] for k in ("session_id", "seq", "hash", "ts")} if dead else None
                assert recovery[0]["detail"]["last_entry"] == expected

            # 3. A released row is re-admitted once with the same binding; then it is terminal too.
            earlier = point.recovered
            if point.recovered is ExecutionState.RELEASED:
                answer = await sessionless_call(
                    http, second.url, "tools__increment", execution_id=execution_id
                )
                assert "result" in answer, answer
                assert receipt_of(answer)["execution_id"] == execution_id
                assert counter_value(counter) == 1
                earlier = ExecutionState.COMPLETED
                assert await execution_state(data_dir, execution_id) is earlier

            # 4. From now on the same id and binding is a replay, every time; another binding collides.
            for _ in range(2):
                refused = await sessionless_call(
                    http, second.url, "tools__increment", execution_id=execution_id
                )
                assert reason_of(refused) == "execution_replay", refused
                assert refused["error"]["data"]["earlier_outcome"] == earlier.value
                _assert_names_the_earlier_attempt(refused["error"]["data"], data_dir, execution_id, point)
            collided = await sessionless_call(
                http, second.url, "tools__echo", {"text": "x"}, execution_id=execution_id
            )
            assert reason_of(collided) == "execution_collision"
            assert counter_value(counter) <= 1
            assert counter_value(counter) == int(
                point.upstream_ran or point.recovered is ExecutionState.RELEASED
            )

            # 5. Every chain that mentions the execution (the dead worker's, recovery's) is closed,
            #    and verifies offline with its claim.
            key = write_public_key(data_dir, tmp_path / "gateway.pem")
            sessions = {e["session_id"] for e in entries_with(data_dir, execution_id)}
            for session_id in sessions:
                bundle, claim = await save_evidence(http, second.url, session_id, tmp_path)
                code, output = verify_quietly(bundle, claim, key)
                assert code == EXIT_OK, output

            # 6. `bastion audit find` (the real entry point) reaches every one of those entries,
            #    recovery's included, and exports each session for `bastion verify`.
            exported = tmp_path / "found"
            with anyio.fail_after(60):
                found = await anyio.run_process(
                    [
                        sys.executable,
                        "-m",
                        "bastion.cli.main",
                        "audit",
                        "find",
                        "--data-dir",
                        str(data_dir),
                        "--execution-id",
                        execution_id,
                        "--agent",
                        "alice",
                        "--export",
                        str(exported),
                    ],
                    check=False,
                )
            assert found.returncode == 0, found.stderr
            listing = found.stdout.decode()
            every = entries_with(data_dir, execution_id)
            assert listing.startswith(f"{len(every)} entries carry execution_id {execution_id!r}")
            for entry in every:
                assert f"session={entry['session_id']} seq={entry['seq']} event={entry['event']}" in listing
            for session_id in sessions:
                bundle, claim = exported / f"{session_id}.jsonl", exported / f"{session_id}.claim.json"
                code, output = verify_quietly(bundle, claim, key)
                assert code == EXIT_OK, output
    assert "Traceback" not in log.read_text()


def _assert_names_the_earlier_attempt(
    data: dict[str, Any], data_dir: Path, execution_id: str, point: KillPoint
) -> None:
    """The replay refusal names the earlier call and the entry (session, seq, hash) that recorded it."""
    assert data["earlier_call_id"] is not None
    named = [
        e
        for e in entries_with(data_dir, execution_id)
        if (e["session_id"], e["seq"]) == (data["earlier_evidence_session_id"], data["earlier_seq"])
    ]
    assert len(named) == 1, data
    assert named[0]["hash"] == data["earlier_entry_hash"]
    assert named[0]["call_id"] == data["earlier_call_id"]
    if point.recovered is ExecutionState.OUTCOME_UNKNOWN:
        # The outcome_unknown a recovering worker wrote, in a session no receipt ever named.
        assert (named[0]["event"], named[0]["epoch"]) == ("outcome_unknown", 2)


# ---------------------------------------------------------------- the crashing store itself


class _Recorder:
    """A stand-in inner store that records what ran, in order."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def mark_invoking(self, agent: str, execution_id: str, **_: Any) -> str:
        self.log.append(f"mark_invoking {execution_id}")
        return "row"

    async def record_outcome(self, agent: str, execution_id: str, outcome: Any, **_: Any) -> str:
        self.log.append(f"record_outcome {execution_id}")
        return "row"

    async def heartbeat(self, worker_id: str, now: Any) -> None:
        self.log.append("heartbeat")


async def test_crashing_store_kills_at_the_named_step_only() -> None:
    """The kill comes after the named op (or before it with ``before:``), for matching executions only."""
    log: list[str] = []

    def kill() -> None:
        log.append("KILL")

    after: Any = CrashingStore(_Recorder(log), "mark_invoking", execution_id="x", kill=kill)  # type: ignore[arg-type]
    await after.heartbeat("w", None)
    await after.mark_invoking("alice", "other", worker="w", epoch=1)
    await after.record_outcome("alice", "x", ExecutionState.COMPLETED, worker="w", epoch=1)
    await after.mark_invoking("alice", "x", worker="w", epoch=1)
    assert log == ["heartbeat", "mark_invoking other", "record_outcome x", "mark_invoking x", "KILL"]

    log.clear()
    before: Any = CrashingStore(_Recorder(log), "before:record_outcome", agent="alice", kill=kill)  # type: ignore[arg-type]
    await before.record_outcome("bob", "x", ExecutionState.COMPLETED, worker="w", epoch=1)
    await before.record_outcome("alice", "x", ExecutionState.COMPLETED, worker="w", epoch=1)
    assert log == ["record_outcome x", "KILL", "record_outcome x"]

    assert parse_kill_point("before:reserve_execution") == ("reserve_execution", True)
    for bad in ("append_entry", "before:", "after:mark_invoking", "heartbeat"):
        with pytest.raises(ValueError, match="unknown kill point"):
            parse_kill_point(bad)
