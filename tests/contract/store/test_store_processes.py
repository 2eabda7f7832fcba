"""Several OS processes on one store (DESIGN section 7): one winner per key, one unforked chain.

Runs on both engines (one SQLite file, one PostgreSQL schema). Each child opens
the store itself (the first opens race the migration), registers its own
worker and generation, reports ``ready``, and starts only when the parent,
having heard every child, writes ``go``: a barrier, not a sleep. Every wait is
bounded by ``fail_after``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from subprocess import PIPE
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from store_support import AGENT, assert_linked, genesis, new_writer

from bastion.admission.states import ExecutionState
from bastion.ids import EvidenceSessionId, ExecutionId
from bastion.store.postgres import PostgresStore
from bastion.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

PROCESSES = 4
KEYS = 40
APPENDS = 40

CHILD = r"""
import json, sys
from datetime import UTC, datetime

import anyio
import anyio.to_thread

from bastion.audit.entry import AuditEntry
from bastion.errors import BastionError
from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.postgres import PostgresStore
from bastion.store.sqlite import SqliteStore
import hashlib


async def main(path, mode, index, count):
    if path.startswith("postgresql:"):
        store = await PostgresStore.connect(path)
    else:
        store = await SqliteStore.open(path)
    try:
        worker = WorkerId(f"proc-{index}")
        now = datetime.now(UTC)
        await store.register_worker(worker, "test", {"index": index}, now=now)
        epoch = await store.claim_generation(f"gen-{index}", worker, now=now, lease_s=600)
        print("ready", flush=True)
        assert (await anyio.to_thread.run_sync(sys.stdin.readline)).strip() == "go"
        results = {}

        async def reserve(n):
            salt = index if mode == "reserve-different" else 0
            binding = hashlib.sha256(f"{salt}-{n}".encode()).hexdigest()
            try:
                await store.reserve_execution(
                    AgentId("agent-1"), ExecutionId(f"k{n}"), binding,
                    call_id=CallId(f"c{index}-{n}"), worker=worker, epoch=epoch,
                )
                results[n] = "Reserved"
            except BastionError as exc:
                results[n] = type(exc).__name__

        async def append(n):
            def build(seq, prev):
                fields = dict.fromkeys(AuditEntry.__dataclass_fields__)
                fields.update(seq=seq, ts="2026-05-01T12:00:00.000000Z", session_id="ev_shared",
                              event="admitted", prev=prev, detail={"proc": index, "n": n})
                return AuditEntry(**fields).seal()
            await store.append_entry(EvidenceSessionId("ev_shared"), build, worker=worker, epoch=epoch)
            results[n] = "appended"

        async with anyio.create_task_group() as tg:
            for n in range(count):
                tg.start_soon(reserve if mode.startswith("reserve") else append, n)
        print(json.dumps(results), flush=True)
    finally:
        await store.aclose()


anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
"""


async def run_children(tmp_path: Path, db: str, mode: str, count: int) -> list[dict[str, str]]:
    """Start PROCESSES children, release them together, and return what each reports."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with anyio.fail_after(120):
        async with AsyncExitStack() as stack:
            procs: list[Process] = []
            for index in range(PROCESSES):
                command = [sys.executable, str(script), db, mode, str(index), str(count)]
                procs.append(
                    await stack.enter_async_context(
                        await anyio.open_process(command, stdin=PIPE, stdout=PIPE, stderr=PIPE)
                    )
                )
            lines = [BufferedByteReceiveStream(p.stdout) for p in procs if p.stdout is not None]
            try:
                for line in lines:
                    assert await line.receive_until(b"\n", 1 << 16) == b"ready"
                for p in procs:
                    assert p.stdin is not None
                    await p.stdin.send(b"go\n")
                reports = [json.loads(await line.receive_until(b"\n", 1 << 20)) for line in lines]
                for p in procs:
                    assert await p.wait() == 0
            except BaseException:
                for p in procs:
                    if p.returncode is None:
                        p.kill()
                    await p.wait()
                    if p.stderr is not None:
                        sys.stderr.write((await _drain(p)).decode(errors="replace"))
                raise
    return reports


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def location(request: pytest.FixtureRequest, engine: str, tmp_path: Path) -> str:
    """Where the children meet: a SQLite file, or the test's PostgreSQL schema."""
    if engine == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "shared.db")


async def open_location(db: str) -> SqliteStore | PostgresStore:
    if db.startswith("postgresql:"):
        return await PostgresStore.connect(db)
    return await SqliteStore.open(db)


async def _drain(process: Process) -> bytes:
    assert process.stderr is not None
    chunks = []
    async for chunk in process.stderr:
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("mode", "loser"), [("reserve-same", "ExecutionInFlight"), ("reserve-different", "ExecutionCollision")]
)
async def test_processes_race_for_the_same_keys(
    request: pytest.FixtureRequest, engine: str, tmp_path: Path, mode: str, loser: str
) -> None:
    """4 processes reserve the same 40 keys on a fresh store: each key has exactly one winner."""
    db = location(request, engine, tmp_path)
    reports = await run_children(tmp_path, db, mode, KEYS)

    for n in range(KEYS):
        assert Counter(report[str(n)] for report in reports) == {"Reserved": 1, loser: PROCESSES - 1}
    async with await open_location(db) as store:
        for n in range(KEYS):
            winner = next(i for i, report in enumerate(reports) if report[str(n)] == "Reserved")
            record = await store.get_execution(AGENT, ExecutionId(f"k{n}"))
            assert record is not None
            assert (record.state, record.generation) == (ExecutionState.RESERVED, f"gen-{winner}")


async def test_processes_append_to_one_chain_without_fork(
    request: pytest.FixtureRequest, engine: str, tmp_path: Path
) -> None:
    """4 processes x 40 concurrent appends on one chain: seq contiguous, every link intact, nothing lost."""
    db = location(request, engine, tmp_path)
    session_id = EvidenceSessionId("ev_shared")
    async with await open_location(db) as store:
        opener = await new_writer(store, "opener", "gen-opener")
        await store.open_chain(session_id, genesis(session_id), worker=opener.worker, epoch=opener.epoch)

    await run_children(tmp_path, db, "append", APPENDS)

    async with await open_location(db) as store:
        entries = await store.read_chain(session_id)
    assert len(entries) == 1 + PROCESSES * APPENDS
    assert_linked(entries)
    details: list[Any] = [e.detail for e in entries[1:]]
    assert Counter(d["proc"] for d in details) == dict.fromkeys(range(PROCESSES), APPENDS)
