"""The worker registry's store operations (DESIGN section 6, issue #5): every engine, one body.

Listing workers and generations, withdrawing liveness at once, failures scoped
to one identity, the backlog a generation left, and attachment records
(session ownership) written under the writer's fencing epoch.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from store_support import AGENT, EID, LEASE_S, NOW, Writer, genesis, later, new_writer

from bastion.admission.states import ExecutionState
from bastion.errors import Conflict, StaleEpoch
from bastion.ids import CallId, Epoch, EvidenceSessionId, WorkerId
from bastion.store.base import AttachmentRecord, Store
from bastion.store.sqlite import SqliteStore, apply_migrations

pytestmark = pytest.mark.anyio

BINDING = hashlib.sha256(b"worker-registry").hexdigest()


async def takeover_pair(store: Store) -> tuple[Writer, Writer]:
    """``a`` held gen at epoch 1; ``b`` took it over at epoch 2 once a's lease ran out."""
    a = await new_writer(store, "w-a", "gen")
    b = await new_writer(store, "w-b", "gen", now=later(LEASE_S))
    return a, b


# ---------------------------------------------------------------- listing


async def test_workers_are_listed_oldest_first_with_the_epoch_they_claimed(store: Store) -> None:
    """list_workers returns every identity, superseded ones included, each with its last claimed epoch."""
    a, b = await takeover_pair(store)
    await store.register_worker(WorkerId("w-idle"), "upstream", {"pid": 9}, now=later(LEASE_S + 1))
    workers = await store.list_workers()
    assert [(w.worker_id, w.generation, w.epoch) for w in workers] == [
        (a.worker, "gen", 1),
        (b.worker, "gen", 2),
        ("w-idle", None, None),
    ]
    assert await store.get_worker(b.worker) == workers[1]


async def test_generations_are_listed_with_holder_and_epoch(store: Store) -> None:
    """list_generations names each generation's current holder and epoch, by name."""
    _, b = await takeover_pair(store)
    other = await new_writer(store, "w-other", "another")
    listed = await store.list_generations()
    assert [(g.generation, g.holder, g.epoch) for g in listed] == [
        ("another", other.worker, 1),
        ("gen", b.worker, 2),
    ]


# ---------------------------------------------------------------- withdrawal and failure


async def test_withdrawn_holder_is_not_live_and_its_generation_is_claimable_at_once(store: Store) -> None:
    """A dead PID withdraws liveness at once, fresh heartbeat or not; the claim gets a higher epoch."""
    a = await new_writer(store, "w-a", "gen")
    await store.heartbeat(a.worker, later(1))
    withdrawn = await store.withdraw_liveness(a.worker, now=later(1), reason="pid 4242 is dead")
    assert withdrawn.withdrawn_at == later(1) and withdrawn.withdraw_reason == "pid 4242 is dead"
    assert not withdrawn.is_live(later(1), LEASE_S)
    b = await new_writer(store, "w-b", "gen", now=later(2))  # well inside a's lease
    assert b.epoch == a.epoch + 1


async def test_withdrawal_is_final_and_first_wins(store: Store) -> None:
    """Nothing restores liveness: a heartbeat is refused (StaleEpoch); a later withdrawal changes nothing."""
    a = await new_writer(store, "w-a", "gen")
    first = await store.withdraw_liveness(a.worker, now=later(1), reason="first")
    again = await store.withdraw_liveness(a.worker, now=later(5), reason="second")
    assert again == first
    with pytest.raises(StaleEpoch):
        await store.heartbeat(a.worker, later(6))
    record = await store.get_worker(a.worker)
    assert record is not None and record.heartbeat_at == NOW  # the refused heartbeat wrote nothing
    with pytest.raises(Conflict):
        await store.claim_generation("gen", a.worker, now=later(LEASE_S * 3), lease_s=LEASE_S)


async def test_withdrawal_refusals(store: Store) -> None:
    """Withdrawing an unknown worker is a Conflict; a withdrawal or failure needs a reason."""
    with pytest.raises(Conflict):
        await store.withdraw_liveness(WorkerId("nobody"), now=NOW, reason="gone")
    with pytest.raises(Conflict):
        await store.mark_worker_failed(WorkerId("nobody"), "gone", NOW)
    a = await new_writer(store, "w-a", "gen")
    with pytest.raises(ValueError):
        await store.withdraw_liveness(a.worker, now=NOW, reason="")
    with pytest.raises(ValueError):
        await store.mark_worker_failed(a.worker, "", NOW)
    record = await store.get_worker(a.worker)
    assert record is not None and record.is_live(NOW, LEASE_S)


async def test_failure_is_scoped_to_one_identity(store: Store) -> None:
    """A failed identity loses liveness and its slot; workers of the same role and cohort are untouched."""
    failing = await new_writer(store, "w-notes-1", "upstream:notes")
    neighbour = await new_writer(store, "w-tools-1", "upstream:tools")
    failed = await store.mark_worker_failed(failing.worker, "process 77 exited", later(1))
    assert (failed.failed_at, failed.failure_reason) == (later(1), "process 77 exited")
    assert not failed.is_live(later(1), LEASE_S)
    kept = await store.get_worker(neighbour.worker)
    assert kept is not None and kept.is_live(later(1), LEASE_S) and kept.failed_at is None
    again = await store.mark_worker_failed(failing.worker, "later reason", later(2))
    assert again.failure_reason == "process 77 exited"
    # Its replacement: a new identity, a strictly higher epoch, at once.
    replacement = await new_writer(store, "w-notes-2", "upstream:notes", now=later(2))
    assert replacement.epoch == failing.epoch + 1
    with pytest.raises(StaleEpoch):
        await store.heartbeat(failing.worker, later(3))


async def test_an_expired_holder_may_still_heartbeat_until_superseded(store: Store) -> None:
    """Unchanged heartbeat semantics: expiry alone is not supersession; only a claim (or withdrawal) is."""
    a = await new_writer(store, "w-a", "gen")
    await store.heartbeat(a.worker, later(LEASE_S * 2))
    record = await store.get_worker(a.worker)
    assert record is not None and record.is_live(later(LEASE_S * 2), LEASE_S)


# ---------------------------------------------------------------- backlog


async def test_backlog_counts_unsettled_executions_and_open_chains_of_one_generation(store: Store) -> None:
    """generation_backlog counts rows reserved or invoking and chains still open, of that generation only."""
    a = await new_writer(store, "w-a", "gen")
    other = await new_writer(store, "w-other", "another")
    assert (await store.generation_backlog("gen")).empty
    await store.reserve_execution(AGENT, EID, BINDING, call_id=CallId("c"), worker=a.worker, epoch=a.epoch)
    await store.open_chain(EvidenceSessionId("ev_a"), genesis("ev_a"), worker=a.worker, epoch=a.epoch)
    await store.open_chain(EvidenceSessionId("ev_o"), genesis("ev_o"), worker=other.worker, epoch=other.epoch)
    backlog = await store.generation_backlog("gen")
    assert (backlog.unsettled_executions, backlog.open_chains, backlog.empty) == (1, 1, False)
    await store.mark_invoking(AGENT, EID, worker=a.worker, epoch=a.epoch)
    await store.record_outcome(AGENT, EID, ExecutionState.COMPLETED, worker=a.worker, epoch=a.epoch)
    await store.close_chain(EvidenceSessionId("ev_a"), worker=a.worker, epoch=a.epoch)
    assert (await store.generation_backlog("gen")).empty
    assert (await store.generation_backlog("unknown")).empty


# ---------------------------------------------------------------- attachments (session ownership)


async def test_attachment_records_are_written_listed_replaced_and_cleared(store: Store) -> None:
    """record_attachment upserts one (worker, session, namespace) record; list filters; clear deletes."""
    gw = await new_writer(store, "w-gw", "gen")
    runtime = await new_writer(store, "w-notes", "upstream:notes")
    first = await store.record_attachment(
        runtime.worker, "ts_1", "notes", later(1), writer=gw.worker, epoch=gw.epoch
    )
    assert first == AttachmentRecord(runtime.worker, "ts_1", "notes", later(1), gw.worker, gw.epoch)
    await store.record_attachment(gw.worker, "ts_1", "tools", later(2), writer=gw.worker, epoch=gw.epoch)
    await store.record_attachment(runtime.worker, "ts_2", "notes", later(3), writer=gw.worker, epoch=gw.epoch)
    again = await store.record_attachment(
        runtime.worker, "ts_1", "notes", later(4), writer=gw.worker, epoch=gw.epoch
    )
    assert again.attached_at == later(4)
    assert [(r.worker_id, r.transport_session_ref) for r in await store.list_attachments(runtime.worker)] == [
        (runtime.worker, "ts_2"),
        (runtime.worker, "ts_1"),
    ]
    by_session = await store.list_attachments(transport_session_ref="ts_1")
    assert [(r.namespace, r.attached_at) for r in by_session] == [("tools", later(2)), ("notes", later(4))]
    assert len(await store.list_attachments()) == 3
    assert await store.clear_attachment(runtime.worker, "ts_1", "notes", writer=gw.worker, epoch=gw.epoch)
    assert not await store.clear_attachment(runtime.worker, "ts_1", "notes", writer=gw.worker, epoch=gw.epoch)
    assert [r.namespace for r in await store.list_attachments(transport_session_ref="ts_1")] == ["tools"]


async def test_attachment_writes_are_fenced(store: Store) -> None:
    """A superseded writer records and clears nothing (StaleEpoch, checked first); the new holder can."""
    a, b = await takeover_pair(store)
    await store.record_attachment(b.worker, "ts_b", "notes", later(LEASE_S), writer=b.worker, epoch=b.epoch)
    with pytest.raises(StaleEpoch):
        await store.record_attachment(
            a.worker, "ts_a", "notes", later(LEASE_S), writer=a.worker, epoch=a.epoch
        )
    with pytest.raises(StaleEpoch):
        await store.clear_attachment(b.worker, "ts_b", "notes", writer=a.worker, epoch=a.epoch)
    with pytest.raises(StaleEpoch):
        await store.record_attachment(
            b.worker, "ts_b", "notes", later(LEASE_S), writer=b.worker, epoch=Epoch(b.epoch + 1)
        )
    assert [r.transport_session_ref for r in await store.list_attachments()] == ["ts_b"]


async def test_attachment_refusals(store: Store) -> None:
    """An unknown worker is a Conflict; an empty session reference or namespace is a ValueError."""
    gw = await new_writer(store, "w-gw", "gen")
    with pytest.raises(Conflict):
        await store.record_attachment(
            WorkerId("nobody"), "ts_1", "notes", NOW, writer=gw.worker, epoch=gw.epoch
        )
    for ref, namespace in (("", "notes"), ("ts_1", "")):
        with pytest.raises(ValueError):
            await store.record_attachment(gw.worker, ref, namespace, NOW, writer=gw.worker, epoch=gw.epoch)
    assert await store.list_attachments() == []


# ---------------------------------------------------------------- SQLite schema 4


async def test_sqlite_version_3_file_gains_the_registry_columns_with_claimed_epochs(tmp_path: Path) -> None:
    """A schema-3 file upgrades to 4: a holder's claimed epoch is backfilled from its generation."""
    db = tmp_path / "v3.db"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        assert apply_migrations(conn, target=3) == 3
        conn.execute("INSERT INTO workers VALUES ('w-old', 'gateway', '{\"pid\": 7}', 1, 2, 'gen')")
        conn.execute("INSERT INTO workers VALUES ('w-new', 'gateway', '{\"pid\": 8}', 3, 3, NULL)")
        conn.execute("INSERT INTO generations VALUES ('gen', 'w-old', 5, 1)")
    finally:
        conn.close()
    async with await SqliteStore.open(db) as upgraded:
        old, new = await upgraded.list_workers()
        assert (old.worker_id, old.epoch, old.withdrawn_at, old.failed_at) == ("w-old", 5, None, None)
        assert (new.worker_id, new.epoch) == ("w-new", None)
        assert await upgraded.list_attachments() == []
