"""SQLite schema versions (DESIGN section 7): an older file is upgraded with its data; a newer one refused."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from store_support import AGENT, EID, assert_linked, genesis, make_entry

from bastion.admission.states import ExecutionState
from bastion.errors import ExecutionInFlight, StoreError
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.migrations import SQLITE_MIGRATIONS
from bastion.store.rows import entry_json
from bastion.store.sqlite import SqliteStore, apply_migrations

pytestmark = pytest.mark.anyio

BINDING = "ab" * 32


def raw(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(db, isolation_level=None)


def schema_version(db: Path) -> int:
    conn = raw(db)
    try:
        return int(conn.execute("SELECT version FROM schema_version").fetchone()[0])
    finally:
        conn.close()


async def test_fresh_file_gets_the_newest_schema_in_wal_with_full_sync(tmp_path: Path) -> None:
    """A new file is migrated to the newest version, journaled in WAL, its writer fully synchronous."""
    db = tmp_path / "new.db"
    async with await SqliteStore.open(db) as store:
        assert store._writer.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store._writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert schema_version(db) == len(SQLITE_MIGRATIONS)


async def test_version_1_file_is_upgraded_and_keeps_its_data(tmp_path: Path) -> None:
    """A file written at schema 1 opens with current code: upgraded, rows intact and usable."""
    db = tmp_path / "v1.db"
    conn = raw(db)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        assert apply_migrations(conn, target=1) == 1
        conn.execute(
            "INSERT INTO workers VALUES ('w-old', 'gateway', '{\"pid\": 7}', 1, ?, 'gen')",
            (1_777_636_800_000_000,),
        )
        conn.execute("INSERT INTO generations VALUES ('gen', 'w-old', 3, 1)")
        conn.execute(
            "INSERT INTO executions VALUES (?, ?, ?, 'invoking', 'c1', 'gen', 'w-old', 3)",
            (AGENT, EID, BINDING),
        )
    finally:
        conn.close()
    assert schema_version(db) == 1

    async with await SqliteStore.open(db) as store:
        record = await store.get_execution(AGENT, EID)
        assert record is not None
        assert (record.state, record.binding, record.epoch) == (ExecutionState.INVOKING, BINDING, 3)
        worker = await store.get_worker(WorkerId("w-old"))
        assert worker is not None and dict(worker.provenance) == {"pid": 7}
        with pytest.raises(ExecutionInFlight):
            await store.reserve_execution(
                AGENT, EID, BINDING, call_id=CallId("c2"), worker=WorkerId("w-old"), epoch=Epoch(3)
            )
        done = await store.record_outcome(
            AGENT, EID, ExecutionState.COMPLETED, worker=WorkerId("w-old"), epoch=Epoch(3)
        )
        assert done.state is ExecutionState.COMPLETED

    assert schema_version(db) == len(SQLITE_MIGRATIONS) == 14
    conn = raw(db)
    try:
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        conn.close()
    assert {"executions_unsettled", "chains_open"} <= indexes


async def test_version_7_entries_move_to_a_table_appended_by_rowid_unchanged(tmp_path: Path) -> None:
    """Version 8 copies entry rows as they were into a rowid table: chains read back, keys stay unique."""
    db = tmp_path / "v7.db"
    sessions = [EvidenceSessionId(f"ev_{n}") for n in range(3)]
    written: dict[str, list] = {}
    conn = raw(db)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        assert apply_migrations(conn, target=7) == 7
        for session in sessions:
            chain = [genesis(session)]
            for seq in range(1, 5):
                chain.append(
                    make_entry(session, seq, chain[-1].hash or "", execution_id=f"x-{session}-{seq}")
                )
            written[session] = chain
            conn.execute(
                "INSERT INTO chains VALUES (?, 'agent-1', ?, ?, ?, 'gen', 0)",
                (session, chain[0].hash, chain[-1].seq, chain[-1].hash),
            )
        # Interleaved, as concurrent sessions write them.
        for seq in range(5):
            for session in sessions:
                entry = written[session][seq]
                conn.execute(
                    "INSERT INTO entries VALUES (?, ?, ?, ?, ?, 'w-old', 3, ?, 'agent-1')",
                    (session, seq, entry.prev, entry.hash, entry_json(entry), entry.execution_id),
                )
    finally:
        conn.close()

    async with await SqliteStore.open(db) as store:
        for session in sessions:
            chain = await store.read_chain(session)
            assert chain == written[session]
            assert_linked(chain)
        found = await store.find_entries(ExecutionId(f"x-{sessions[1]}-3"), agent=AGENT)
        assert found == [written[sessions[1]][3]]

    assert schema_version(db) == len(SQLITE_MIGRATIONS)
    conn = raw(db)
    try:
        table = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'entries'").fetchone()[0]
        assert "WITHOUT ROWID" not in table.upper()
        indexes = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'entries'")
        }
        assert "entries_by_execution" in indexes
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 15
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO entries VALUES (?, 1, 'p', 'h', '{}', 'w', 1, NULL, NULL)", (sessions[0],)
            )
    finally:
        conn.close()


async def test_file_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    """A schema version this code does not know fails closed: StoreError naming both versions."""
    db = tmp_path / "future.db"
    async with await SqliteStore.open(db):
        pass
    conn = raw(db)
    try:
        conn.execute("UPDATE schema_version SET version = 99")
    finally:
        conn.close()
    with pytest.raises(StoreError) as caught:
        await SqliteStore.open(db)
    assert caught.value.data == {"file_version": 99, "code_version": len(SQLITE_MIGRATIONS)}


def test_migrations_are_idempotent_and_never_downgrade(tmp_path: Path) -> None:
    """Applying twice changes nothing; a lower target leaves a newer file as it is."""
    conn = raw(tmp_path / "x.db")
    try:
        assert apply_migrations(conn) == len(SQLITE_MIGRATIONS)
        assert apply_migrations(conn) == len(SQLITE_MIGRATIONS)
        assert apply_migrations(conn, target=1) == len(SQLITE_MIGRATIONS)
    finally:
        conn.close()


@pytest.mark.parametrize("path", [":memory:", "file:x?mode=memory"])
async def test_unshareable_paths_are_refused(path: str) -> None:
    """The store needs a file several connections and processes can share."""
    with pytest.raises(ValueError):
        await SqliteStore.open(path)


async def test_version_13_tasks_read_back_without_a_tool(tmp_path: Path) -> None:
    """Version 14 adds the creating call's tool to a task row; a row written before reads back ``None``."""
    db = tmp_path / "v13.db"
    conn = raw(db)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        assert apply_migrations(conn, target=13) == 13
        conn.execute(
            "INSERT INTO tasks (task_id, agent, agent_session_id, server, upstream_task_id, call_id,"
            " evidence_session_id, execution_id, status, created_at, updated_at)"
            " VALUES ('task_old', 'ada', NULL, 'tasks', 'up-old', 'call-old', 'ev_old', NULL,"
            " 'working', 1, 1)"
        )
        conn.commit()
    finally:
        conn.close()
    async with await SqliteStore.open(db) as store:
        record = await store.get_task(
            "task_old", agent=AgentId("ada"), agent_session_id=None, now=datetime.now(UTC)
        )
    assert record is not None and record.tool is None and record.upstream_task_id == "up-old"
    assert schema_version(db) == 14
