"""Operations on transport session records, the change feed and policy reports (``store/replicas.py``).

Written once for both engines. The feed's ``seq`` is handed out in commit
order: SQLite has one writer at a time, and PostgreSQL's migration makes every
insert into ``changes`` wait for the previous one to commit (a transaction
advisory lock taken by trigger), so a follower reading "after my cursor"
never skips a change that commits late.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bastion.errors import Conflict
from bastion.ids import AgentId, Epoch, WorkerId
from bastion.store.ops.workers import fence
from bastion.store.replicas import Change, ChangeKind, PolicyReport, TransportSessionRecord
from bastion.store.rows import from_us, maybe_from_us
from bastion.store.statements import Op, count, execute, one, rows

SELECT_TRANSPORT_SESSION = (
    "SELECT key, agent, agent_session_id, credential_id, protocol_version, client_capabilities,"
    " client_info, created_at, last_seen_at, created_by, terminated_at, terminate_reason"
    " FROM transport_sessions WHERE key = ?"
)


def create_transport_session(values: tuple[Any, ...], key: str, writer: WorkerId, epoch: Epoch) -> Op[None]:
    yield from fence(writer, epoch)
    if (yield from one("SELECT 1 FROM transport_sessions WHERE key = ?", key)) is not None:
        raise Conflict("the transport session exists")
    yield from execute(
        "INSERT INTO transport_sessions (key, agent, agent_session_id, credential_id, protocol_version,"
        " client_capabilities, client_info, created_at, last_seen_at, created_by)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        *values,
    )


def get_transport_session(key: str) -> Op[TransportSessionRecord | None]:
    row = yield from one(SELECT_TRANSPORT_SESSION, key)
    return None if row is None else transport_session_from_row(row)


def list_transport_sessions(seen_since_us: int) -> Op[list[TransportSessionRecord]]:
    select_all = SELECT_TRANSPORT_SESSION.removesuffix(" WHERE key = ?")
    found = yield from rows(
        select_all + " WHERE terminated_at IS NULL AND last_seen_at >= ? ORDER BY created_at, key",
        seen_since_us,
    )
    return [transport_session_from_row(row) for row in found]


def touch_transport_sessions(keys: Sequence[str], now_us: int, writer: WorkerId, epoch: Epoch) -> Op[None]:
    yield from fence(writer, epoch)
    marks = ", ".join("?" for _ in keys)  # placeholders only: every value is a parameter
    sql = "UPDATE transport_sessions SET last_seen_at = ? WHERE terminated_at IS NULL AND last_seen_at < ?"
    yield from execute(sql + " AND key IN (" + marks + ")", now_us, now_us, *keys)


def terminate_transport_session(key: str, reason: str, now_us: int) -> Op[bool]:
    # The trigger of migration 7 (SQLite) / 4 (PostgreSQL) puts the termination into the feed.
    changed = yield from count(
        "UPDATE transport_sessions SET terminated_at = ?, terminate_reason = ?"
        " WHERE key = ? AND terminated_at IS NULL",
        now_us, reason, key,
    )  # fmt: skip
    return changed == 1


def publish_change(
    kind: ChangeKind, subject: str, detail_json: str | None, origin: WorkerId, now_us: int
) -> Op[int]:
    row = yield from one(
        "INSERT INTO changes (kind, subject, detail, origin, at) VALUES (?, ?, ?, ?, ?) RETURNING seq",
        kind.value, subject, detail_json, origin, now_us,
    )  # fmt: skip
    assert row is not None
    return int(row[0])


def changes_after(seq: int, limit: int) -> Op[list[Change]]:
    found = yield from rows(
        "SELECT seq, kind, subject, detail, origin, at FROM changes WHERE seq > ? ORDER BY seq LIMIT ?",
        seq, limit,
    )  # fmt: skip
    return [change_from_row(row) for row in found]


def latest_change() -> Op[int]:
    row = yield from one("SELECT MAX(seq) FROM changes")
    return 0 if row is None or row[0] is None else int(row[0])


def prune_changes(before_us: int) -> Op[int]:
    # Never the newest change: it carries the feed's head, so a seq is never handed out twice
    # (SQLite AUTOINCREMENT and PostgreSQL sequences never go back anyway).
    gone = yield from count(
        "DELETE FROM changes WHERE at < ? AND seq < (SELECT MAX(seq) FROM changes)", before_us
    )
    gone += yield from count(
        "DELETE FROM transport_sessions WHERE COALESCE(terminated_at, last_seen_at) < ?", before_us
    )
    return gone


def report_policy(
    version: str, reload_error: str | None, now_us: int, writer: WorkerId, epoch: Epoch
) -> Op[None]:
    yield from fence(writer, epoch)
    yield from execute(
        "INSERT INTO policy_reports (worker_id, policy_version, reload_error, reported_at)"
        " VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET policy_version = excluded.policy_version,"
        " reload_error = excluded.reload_error, reported_at = excluded.reported_at",
        writer, version, reload_error, now_us,
    )  # fmt: skip


def list_policy_reports() -> Op[list[PolicyReport]]:
    found = yield from rows(
        "SELECT worker_id, policy_version, reload_error, reported_at FROM policy_reports"
        " ORDER BY reported_at, worker_id"
    )
    return [PolicyReport(WorkerId(r[0]), r[1], r[2], from_us(r[3])) for r in found]


def transport_session_from_row(row: tuple[Any, ...]) -> TransportSessionRecord:
    return TransportSessionRecord(
        row[0], AgentId(row[1]), row[2], row[3], row[4], json.loads(row[5]), json.loads(row[6]),
        from_us(row[7]), from_us(row[8]), WorkerId(row[9]), maybe_from_us(row[10]), row[11],
    )  # fmt: skip


def change_from_row(row: tuple[Any, ...]) -> Change:
    return Change(
        int(row[0]), ChangeKind(row[1]), row[2], None if row[3] is None else json.loads(row[3]),
        None if row[4] is None else WorkerId(row[4]), from_us(row[5]),
    )  # fmt: skip
