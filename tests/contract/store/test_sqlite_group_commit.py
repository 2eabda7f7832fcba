"""SQLite group commit (DESIGN section 10): one transaction for queued writes, each with its own result.

These tests hold the engine's batch lock (a private attribute, taken by the
writer thread around each batch) so that a batch forms deterministically:
every write is queued before the lock is released.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from store_support import AGENT, Writer, builder, genesis, new_writer

from bastion.admission.states import ExecutionState
from bastion.audit.entry import AuditEntry
from bastion.errors import BastionError, ExecutionCollision, NotDurable, StaleEpoch, StoreError
from bastion.ids import CallId, Epoch, EvidenceSessionId, ExecutionId
from bastion.store.base import Reserved
from bastion.store.sqlite import SqliteStore
from bastion.store.statements import Op, execute

pytestmark = pytest.mark.anyio

B0, B1 = "00" * 32, "11" * 32
SESSION = EvidenceSessionId("ev_batch")


@pytest.fixture
async def sqlite_store(tmp_path: Path, anyio_backend: str) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(tmp_path / "batch.db") as store:
        yield store


async def one_batch(store: SqliteStore, writes: list[Callable[[], Awaitable[object]]]) -> list[object]:
    """Queue every write behind the held batch lock, release it, and collect results in order."""
    results: list[object] = [None] * len(writes)

    async def run(i: int) -> None:
        try:
            results[i] = await writes[i]()
        except (BastionError, ValueError, RuntimeError) as exc:
            results[i] = exc

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            store._batch_lock.acquire()
            try:
                for i in range(len(writes)):
                    tg.start_soon(run, i)
                await anyio.wait_all_tasks_blocked()
                assert len(store._pending) == len(writes)
            finally:
                store._batch_lock.release()
    return results


def reserve(store: SqliteStore, w: Writer, eid: str, binding: str) -> Callable[[], Awaitable[object]]:
    return lambda: store.reserve_execution(
        AGENT, ExecutionId(eid), binding, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
    )


async def test_queued_writes_share_one_transaction_and_keep_their_own_errors(
    sqlite_store: SqliteStore,
) -> None:
    """Six queued writes commit in one transaction; refusals and a failing builder stay their own."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    await store.open_chain(SESSION, genesis(SESSION), worker=w.worker, epoch=w.epoch)
    stale = Writer(w.worker, Epoch(w.epoch + 7), w.generation)

    def broken(seq: int, prev: str) -> AuditEntry:
        raise RuntimeError("builder failed")

    before = store.committed_transactions
    results = await one_batch(
        store,
        [
            reserve(store, w, "e1", B0),
            reserve(store, w, "e1", B1),
            lambda: store.append_entry(SESSION, broken, worker=w.worker, epoch=w.epoch),
            lambda: store.append_entry(SESSION, builder(SESSION), worker=w.worker, epoch=w.epoch),
            reserve(store, stale, "e2", B0),
            lambda: store.append_entry(SESSION, builder(SESSION), worker=w.worker, epoch=w.epoch),
        ],
    )
    assert store.committed_transactions == before + 1
    assert [type(r).__name__ for r in results] == [
        "Reserved", "ExecutionCollision", "RuntimeError", "AuditEntry", "StaleEpoch", "AuditEntry",
    ]  # fmt: skip
    assert isinstance(results[1], ExecutionCollision) and isinstance(results[4], StaleEpoch)
    assert [e.seq for e in await store.read_chain(SESSION)] == [0, 1, 2]
    assert await store.get_execution(AGENT, ExecutionId("e2")) is None


async def test_savepoints_are_taken_only_when_a_write_of_the_batch_fails(
    sqlite_store: SqliteStore,
) -> None:
    """A clean batch runs with no savepoint; one refused write reruns the batch with one per write."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    statements: list[str] = []
    store._writer.set_trace_callback(statements.append)
    try:
        clean = await one_batch(store, [reserve(store, w, f"c{n}", B0) for n in range(3)])
        assert all(isinstance(r, Reserved) for r in clean), clean
        assert not [s for s in statements if s.startswith("SAVEPOINT")]
        statements.clear()
        mixed = await one_batch(
            store, [reserve(store, w, "m1", B0), reserve(store, w, "c0", B1), reserve(store, w, "m2", B0)]
        )
    finally:
        store._writer.set_trace_callback(None)
    assert [type(r).__name__ for r in mixed] == ["Reserved", "ExecutionCollision", "Reserved"]
    assert len([s for s in statements if s.startswith("SAVEPOINT")]) == 3
    assert statements.count("COMMIT") == 1 and statements.count("ROLLBACK") == 1
    for eid in ("m1", "m2"):
        assert await store.get_execution(AGENT, ExecutionId(eid)) is not None


async def test_failed_commit_fails_every_write_of_the_batch(sqlite_store: SqliteStore) -> None:
    """If COMMIT fails, every write of the batch raises NotDurable (refusals too) and none is kept."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    await store.reserve_execution(
        AGENT, ExecutionId("e0"), B0, call_id=CallId("c"), worker=w.worker, epoch=w.epoch
    )

    def poison() -> Op[None]:
        # A deferred foreign-key violation passes every statement and fails COMMIT itself.
        yield from execute("PRAGMA defer_foreign_keys = ON")
        yield from execute("INSERT INTO claims (session_id, claim) VALUES ('ev_missing', '{}')")

    results = await one_batch(
        store,
        [
            reserve(store, w, "e1", B0),
            reserve(store, w, "e0", B1),
            lambda: store._write(poison),
            lambda: store.mark_invoking(AGENT, ExecutionId("e0"), worker=w.worker, epoch=w.epoch),
        ],
    )
    assert all(isinstance(r, NotDurable) for r in results), results
    assert await store.get_execution(AGENT, ExecutionId("e1")) is None
    record = await store.get_execution(AGENT, ExecutionId("e0"))
    assert record is not None and record.state is ExecutionState.RESERVED


async def test_aborted_transaction_fails_every_write_of_the_batch(sqlite_store: SqliteStore) -> None:
    """When SQLite abandons the transaction mid-batch (I/O error, full disk), every write is NotDurable."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")

    def abort() -> Op[None]:
        yield from execute("ROLLBACK")
        raise sqlite3.OperationalError("disk I/O error")

    results = await one_batch(store, [reserve(store, w, "e1", B0), lambda: store._write(abort)])
    assert all(isinstance(r, NotDurable) for r in results), results
    assert await store.get_execution(AGENT, ExecutionId("e1")) is None
    # The engine is usable again at once.
    assert isinstance(await reserve(store, w, "e1", B0)(), Reserved)


async def test_max_batch_one_commits_each_write_alone(tmp_path: Path) -> None:
    """max_batch=1 turns group commit off: one transaction per write."""
    async with await SqliteStore.open(tmp_path / "solo.db", max_batch=1) as store:
        w = await new_writer(store, "w-a", "gen")
        before = store.committed_transactions
        await one_batch(store, [reserve(store, w, f"e{i}", B0) for i in range(5)])
        assert store.committed_transactions == before + 5


async def test_a_write_cancelled_while_queued_does_not_happen(sqlite_store: SqliteStore) -> None:
    """A caller cancelled before its write was taken into a batch leaves no trace."""
    store = sqlite_store
    w = await new_writer(store, "w-a", "gen")
    with anyio.fail_after(30):
        store._batch_lock.acquire()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(reserve(store, w, "e1", B0))
                await anyio.wait_all_tasks_blocked()
                assert len(store._pending) == 1
                tg.cancel_scope.cancel()
            # The cancelled caller has ended (withdrawing its write) before the writer may run.
        finally:
            store._batch_lock.release()
    assert store._pending == []
    assert await store.get_execution(AGENT, ExecutionId("e1")) is None


async def test_close_fails_queued_writes_and_ends_the_writer_thread(tmp_path: Path) -> None:
    """Closing the store fails every write still queued with StoreError, then its writer thread ends."""
    store = await SqliteStore.open(tmp_path / "closing.db")
    w = await new_writer(store, "w-a", "gen")
    results: list[object] = [None] * 3

    async def run(i: int) -> None:
        try:
            results[i] = await reserve(store, w, f"e{i}", B0)()
        except StoreError as exc:
            results[i] = exc

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            store._batch_lock.acquire()
            try:
                for i in range(3):
                    tg.start_soon(run, i)
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(store.aclose)
                await anyio.wait_all_tasks_blocked()
            finally:
                store._batch_lock.release()
    assert all(isinstance(r, StoreError) and "closed" in str(r) for r in results), results
    assert not store._thread.is_alive()
    with pytest.raises(StoreError, match="closed"):
        await reserve(store, w, "e9", B0)()
