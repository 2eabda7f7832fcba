"""The SQLite engine's ``ReplicaRecords`` (``store/replicas.py``, issue #10), mixed into ``SqliteStore``.

Writes go through the engine's group-committed writer, reads through its
read-only pool; each write is one atomic transaction as the contract says.
Revocations and terminations enter the change feed by trigger (migration 5).
On SQLite the feed is polled (``propagation/feed.py``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

# The engine composes this mixin, and this mixin uses the engine's row helpers: a circular import
# that Python resolves because nothing here is read before the engine module has finished loading.
import bastion.store.sqlite as engine
from bastion.errors import Conflict
from bastion.ids import AgentId, Epoch, WorkerId
from bastion.store.replicas import Change, ChangeKind, PolicyReport, TransportSessionRecord

__all__ = ["SqliteReplicaRecords"]

T = TypeVar("T")

_SELECT_TRANSPORT_SESSION = (
    "SELECT key, agent, agent_session_id, credential_id, protocol_version, client_capabilities,"
    " client_info, created_at, last_seen_at, created_by, terminated_at, terminate_reason"
    " FROM transport_sessions WHERE key = ?"
)


class _Engine(Protocol):
    async def _write(self, op: Callable[[sqlite3.Connection], T]) -> T: ...
    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T: ...


class SqliteReplicaRecords:
    """Transport sessions, the change feed and policy reports on SQLite."""

    async def create_transport_session(
        self: _Engine, record: TransportSessionRecord, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        def op(conn: sqlite3.Connection) -> None:
            engine._fence(conn, writer, epoch)
            try:
                conn.execute(
                    "INSERT INTO transport_sessions (key, agent, agent_session_id, credential_id,"
                    " protocol_version, client_capabilities, client_info, created_at, last_seen_at,"
                    " created_by)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.key, record.agent, record.agent_session_id, record.credential_id,
                        record.protocol_version, engine._dumps(dict(record.client_capabilities)),
                        engine._dumps(dict(record.client_info)), engine._to_us(record.created_at),
                        engine._to_us(record.last_seen_at), writer,
                    ),
                )  # fmt: skip
            except sqlite3.IntegrityError as exc:
                raise Conflict("the transport session exists") from exc

        await self._write(op)

    async def get_transport_session(self: _Engine, key: str) -> TransportSessionRecord | None:
        def op(conn: sqlite3.Connection) -> TransportSessionRecord | None:
            row = conn.execute(_SELECT_TRANSPORT_SESSION, (key,)).fetchone()
            return None if row is None else _transport_session_from_row(row)

        return await self._read(op)

    async def touch_transport_sessions(
        self: _Engine, keys: Sequence[str], now: datetime, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        now_us = engine._to_us(now)
        rows = [(now_us, key) for key in keys]

        def op(conn: sqlite3.Connection) -> None:
            engine._fence(conn, writer, epoch)
            conn.executemany(
                "UPDATE transport_sessions SET last_seen_at = MAX(last_seen_at, ?)"
                " WHERE key = ? AND terminated_at IS NULL",
                rows,
            )

        await self._write(op)

    async def terminate_transport_session(self: _Engine, key: str, reason: str, now: datetime) -> bool:
        now_us = engine._to_us(now)

        def op(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE transport_sessions SET terminated_at = ?, terminate_reason = ?"
                " WHERE key = ? AND terminated_at IS NULL",
                (now_us, reason, key),
            )
            return cursor.rowcount == 1

        return await self._write(op)

    async def publish_change(
        self: _Engine, kind: ChangeKind, subject: str, detail: Mapping[str, Any] | None, *, origin: WorkerId
    ) -> int:
        text = None if detail is None else engine._dumps(dict(detail))

        def op(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "INSERT INTO changes (kind, subject, detail, origin, at) VALUES (?, ?, ?, ?, ?)",
                (kind.value, subject, text, origin, engine._to_us(datetime.now(UTC))),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

        return await self._write(op)

    async def changes_after(self: _Engine, seq: int, *, limit: int = 500) -> list[Change]:
        def op(conn: sqlite3.Connection) -> list[Change]:
            rows = conn.execute(
                "SELECT seq, kind, subject, detail, origin, at FROM changes"
                " WHERE seq > ? ORDER BY seq LIMIT ?",
                (seq, limit),
            ).fetchall()
            return [_change_from_row(row) for row in rows]

        return await self._read(op)

    async def latest_change(self: _Engine) -> int:
        def op(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT MAX(seq) FROM changes").fetchone()
            return 0 if row[0] is None else int(row[0])

        return await self._read(op)

    async def prune_changes(self: _Engine, before: datetime) -> int:
        before_us = engine._to_us(before)

        def op(conn: sqlite3.Connection) -> int:
            # AUTOINCREMENT: a pruned seq is never handed out again, so followers never miss one.
            gone = conn.execute("DELETE FROM changes WHERE at < ?", (before_us,)).rowcount
            gone += conn.execute(
                "DELETE FROM transport_sessions WHERE COALESCE(terminated_at, last_seen_at) < ?", (before_us,)
            ).rowcount
            return gone

        return await self._write(op)

    async def report_policy(
        self: _Engine,
        version: str,
        reload_error: str | None,
        now: datetime,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> None:
        def op(conn: sqlite3.Connection) -> None:
            engine._fence(conn, writer, epoch)
            conn.execute(
                "INSERT INTO policy_reports (worker_id, policy_version, reload_error, reported_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET"
                " policy_version = excluded.policy_version, reload_error = excluded.reload_error,"
                " reported_at = excluded.reported_at",
                (writer, version, reload_error, engine._to_us(now)),
            )

        await self._write(op)

    async def list_policy_reports(self: _Engine) -> list[PolicyReport]:
        def op(conn: sqlite3.Connection) -> list[PolicyReport]:
            rows = conn.execute(
                "SELECT worker_id, policy_version, reload_error, reported_at FROM policy_reports"
                " ORDER BY reported_at, worker_id"
            ).fetchall()
            return [PolicyReport(WorkerId(r[0]), r[1], r[2], engine._from_us(r[3])) for r in rows]

        return await self._read(op)


def _transport_session_from_row(row: tuple[Any, ...]) -> TransportSessionRecord:
    return TransportSessionRecord(
        row[0], AgentId(row[1]), row[2], row[3], row[4], json.loads(row[5]), json.loads(row[6]),
        engine._from_us(row[7]), engine._from_us(row[8]), WorkerId(row[9]),
        None if row[10] is None else engine._from_us(row[10]), row[11],
    )  # fmt: skip


def _change_from_row(row: tuple[Any, ...]) -> Change:
    return Change(
        int(row[0]), ChangeKind(row[1]), row[2], None if row[3] is None else json.loads(row[3]),
        None if row[4] is None else WorkerId(row[4]), engine._from_us(row[5]),
    )  # fmt: skip
