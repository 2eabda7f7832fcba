"""Operations on tasks and their owners (unfenced: see store/tasks.py).

Each operation checks the owner's agent session first, whatever the task id,
then reads the row under the owner's ``(agent, agent_session_id)``: an unknown
id and another owner's id take the same statements and give the same ``None``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bastion.errors import Conflict
from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId
from bastion.store.ops.agent_sessions import usable_agent_session
from bastion.store.rows import from_us
from bastion.store.statements import Op, count, execute, one, rows
from bastion.store.tasks import TERMINAL_STATUSES, NewTask, TaskRecord, TaskStatus

SELECT_TASK = (
    "SELECT task_id, agent, agent_session_id, server, upstream_task_id, call_id, evidence_session_id,"
    " execution_id, status, created_at, updated_at, tool FROM tasks"
)
_SELECT_CREATED = "SELECT created_at FROM tasks"
# A NULL agent session (an agent on a static token) matches only NULL (SQLite 3.39+, PostgreSQL).
_OWNED = " WHERE agent = ? AND agent_session_id IS NOT DISTINCT FROM ?"


def task_from_row(row: tuple[Any, ...]) -> TaskRecord:
    return TaskRecord(
        row[0], AgentId(row[1]), row[2], row[3], row[4], CallId(row[5]), EvidenceSessionId(row[6]),
        None if row[7] is None else ExecutionId(row[7]), TaskStatus(row[8]),
        from_us(row[9]), from_us(row[10]), row[11],
    )  # fmt: skip


def _owner_may_act(agent_session_id: str | None, now: datetime, lock: str) -> Op[None]:
    if agent_session_id is not None:
        yield from usable_agent_session(agent_session_id, now, lock=lock)


def create_task(task_id: str, task: NewTask, now: datetime, now_us: int) -> Op[TaskRecord]:
    yield from _owner_may_act(task.agent_session_id, now, "FOR SHARE")
    execution_id, server = task.execution_id, task.server
    replayed = execution_id is not None and (
        yield from one("SELECT 1 FROM tasks WHERE agent = ? AND execution_id = ?", task.agent, execution_id)
    )
    if replayed:
        raise Conflict("this execution already created a task", execution_id=execution_id)
    if (yield from one(
        "SELECT 1 FROM tasks WHERE server = ? AND upstream_task_id = ?", server, task.upstream_task_id
    )):  # fmt: skip
        raise Conflict("this upstream task is recorded", server=server)
    yield from execute(
        "INSERT INTO tasks (task_id, agent, agent_session_id, server, upstream_task_id, call_id,"
        " evidence_session_id, execution_id, status, created_at, updated_at, tool)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        task_id, task.agent, task.agent_session_id, server, task.upstream_task_id, task.call_id,
        task.evidence_session_id, execution_id, task.status.value, now_us, now_us, task.tool,
    )  # fmt: skip
    row = yield from one(SELECT_TASK + " WHERE task_id = ?", task_id)
    assert row is not None
    return task_from_row(row)


def get_task(
    task_id: str, agent: AgentId, agent_session_id: str | None, now: datetime, *, lock: str = ""
) -> Op[TaskRecord | None]:
    # A write locks the task row; the agent session only against a concurrent revocation.
    yield from _owner_may_act(agent_session_id, now, "FOR SHARE" if lock else "")
    row = yield from one(
        SELECT_TASK + _OWNED + " AND task_id = ?", agent, agent_session_id, task_id, lock=lock
    )
    return None if row is None else task_from_row(row)


def task_of_execution(
    execution_id: ExecutionId, agent: AgentId, agent_session_id: str | None, now: datetime
) -> Op[TaskRecord | None]:
    yield from _owner_may_act(agent_session_id, now, "")
    row = yield from one(
        SELECT_TASK + _OWNED + " AND execution_id = ?", agent, agent_session_id, execution_id
    )
    return None if row is None else task_from_row(row)


def task_of_upstream(
    server: str, upstream_task_id: str, agent: AgentId, agent_session_id: str | None, now: datetime
) -> Op[TaskRecord | None]:
    yield from _owner_may_act(agent_session_id, now, "")
    row = yield from one(
        SELECT_TASK + _OWNED + " AND server = ? AND upstream_task_id = ?",
        agent, agent_session_id, server, upstream_task_id,
    )  # fmt: skip
    return None if row is None else task_from_row(row)


def set_task_status(
    task_id: str,
    status: TaskStatus,
    agent: AgentId,
    agent_session_id: str | None,
    now: datetime,
    now_us: int,
) -> Op[tuple[TaskRecord, bool] | None]:
    record = yield from get_task(task_id, agent, agent_session_id, now, lock="FOR UPDATE")
    if record is None:
        return None
    if record.status is status or record.status in TERMINAL_STATUSES:
        return record, False
    # The first terminal status wins, even against a concurrent write at another replica.
    changed = yield from count(
        "UPDATE tasks SET status = ?, updated_at = ? WHERE task_id = ? AND status = ?",
        status.value, now_us, task_id, record.status.value,
    )  # fmt: skip
    row = yield from one(SELECT_TASK + " WHERE task_id = ?", task_id)
    assert row is not None
    return task_from_row(row), changed == 1


def list_tasks(
    agent: AgentId, agent_session_id: str | None, now: datetime, after: str | None, limit: int
) -> Op[list[TaskRecord]]:
    yield from _owner_may_act(agent_session_id, now, "")
    if after is None:
        found = yield from rows(
            SELECT_TASK + _OWNED + " ORDER BY created_at, task_id LIMIT ?", agent, agent_session_id, limit
        )
        return [task_from_row(row) for row in found]
    cursor = yield from one(_SELECT_CREATED + _OWNED + " AND task_id = ?", agent, agent_session_id, after)
    if cursor is None:
        return []
    found = yield from rows(
        SELECT_TASK + _OWNED + " AND (created_at > ? OR (created_at = ? AND task_id > ?))"
        " ORDER BY created_at, task_id LIMIT ?",
        agent, agent_session_id, cursor[0], cursor[0], after, limit,
    )  # fmt: skip
    return [task_from_row(row) for row in found]
