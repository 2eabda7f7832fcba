"""SQLite writes run on the caller's thread when the store is idle (``SqliteStore._write_now``).

An idle store spares a lone caller the writer thread's two hand-offs; under load, writes
still queue for group commit; and a write run on the caller's thread never waits for
another connection's file lock (it would hold the caller's event loop).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from store_support import AGENT, builder, genesis, new_writer

from bastion.errors import ExecutionCollision, NotDurable
from bastion.ids import CallId, EvidenceSessionId, ExecutionId
from bastion.store.base import Reserved
from bastion.store.sqlite import SqliteStore
from bastion.store.statements import Op, execute

pytestmark = pytest.mark.anyio

B0, B1 = "00" * 32, "11" * 32
SESSION = EvidenceSessionId("ev_now")


@pytest.fixture
async def sqlite_store(tmp_path: Path, anyio_backend: str) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(tmp_path / "now.db") as store:
        yield store


def idle(store: SqliteStore) -> None:
    """Make the store look idle for a while: its next write may run on the caller's thread."""
    store._last_write_end = 0.0


def writing_threads(store: SqliteStore) -> list[int]:
    """Start recording the thread of each INSERT/UPDATE the writer's connection runs."""
    seen: list[int] = []

    def trace(statement: str) -> None:
        if statement.startswith(("INSERT", "UPDATE")):
            seen.append(threading.get_ident())

    store._writer.set_trace_callback(trace)
    return seen


async def test_a_write_to_an_idle_store_runs_on_the_callers_thread(sqlite_store: SqliteStore) -> None:
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    seen = writing_threads(store)
    idle(store)
    before = store.committed_transactions
    result = await store.reserve_execution(
        AGENT, ExecutionId("e1"), B0, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
    )
    assert isinstance(result, Reserved)
    assert seen and set(seen) == {threading.get_ident()}
    assert store.committed_transactions == before + 1
    # While writes keep the store busy, the next one goes to the writer thread.
    seen.clear()
    store._last_write_took = 3600.0
    await store.reserve_execution(
        AGENT, ExecutionId("e2"), B0, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
    )
    assert seen and threading.get_ident() not in seen


async def test_a_burst_of_writes_from_an_idle_store_still_shares_transactions(
    sqlite_store: SqliteStore,
) -> None:
    """Only the burst's first write runs at once: the rest find the store busy and group commit."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    idle(store)
    before = store.committed_transactions
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for n in range(16):
                tg.start_soon(
                    lambda n=n: store.reserve_execution(
                        AGENT, ExecutionId(f"b{n}"), B0, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
                    )
                )
    for n in range(16):
        assert await store.get_execution(AGENT, ExecutionId(f"b{n}")) is not None
    assert store.committed_transactions - before <= 8


async def test_refusals_and_failures_on_the_callers_thread_are_the_writes_own(
    sqlite_store: SqliteStore,
) -> None:
    """The same typed results as a queued write: a collision, a failing builder, an aborted transaction."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    seen = writing_threads(store)
    idle(store)
    await store.open_chain(SESSION, genesis(SESSION), worker=w.worker, epoch=w.epoch)
    idle(store)
    await store.reserve_execution(
        AGENT, ExecutionId("e1"), B0, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
    )
    idle(store)
    with pytest.raises(ExecutionCollision):
        await store.reserve_execution(
            AGENT, ExecutionId("e1"), B1, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
        )

    def broken(seq: int, prev: str) -> object:
        raise RuntimeError("builder failed")

    idle(store)
    with pytest.raises(RuntimeError, match="builder failed"):
        await store.append_entry(SESSION, broken, worker=w.worker, epoch=w.epoch)  # type: ignore[arg-type]

    def abort() -> Op[None]:
        yield from execute("ROLLBACK")
        raise sqlite3.OperationalError("disk I/O error")

    idle(store)
    with pytest.raises(NotDurable):
        await store._write(abort)
    idle(store)
    entry = await store.append_entry(SESSION, builder(SESSION), worker=w.worker, epoch=w.epoch)
    assert entry.seq == 1
    assert [e.seq for e in await store.read_chain(SESSION)] == [0, 1]
    assert seen and set(seen) == {threading.get_ident()}


async def test_a_write_never_waits_for_another_connections_lock_on_the_callers_thread(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    """Another connection holds the file lock: the write queues, the loop runs on, the write lands."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    seen = writing_threads(store)
    other = sqlite3.connect(tmp_path / "now.db", isolation_level=None, check_same_thread=False)
    ticks = 0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.sleep(0.01)

    async def write() -> None:
        idle(store)
        await store.reserve_execution(
            AGENT, ExecutionId("e1"), B0, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
        )
        done.set()

    try:
        other.execute("BEGIN IMMEDIATE")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                tg.start_soon(write)
                await anyio.sleep(0.3)
                assert not done.is_set()
                ticks_while_locked = ticks
                other.execute("COMMIT")
    finally:
        other.close()
    assert ticks_while_locked >= 5  # the loop was never held by the waiting write
    assert await store.get_execution(AGENT, ExecutionId("e1")) is not None
    assert seen and threading.get_ident() not in seen
