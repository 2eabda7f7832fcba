"""Tasks in the store, and who owns them: any replica serves any task (issue 24).

A task is work an upstream started for a ``tools/call`` through the gateway and
that the client then polls, collects and cancels. The store keeps one row per
task: the gateway's own id (``task_id``, the only one a client sees), the
upstream's (``upstream_task_id``, never shown), the owner (agent and agent
session), the server and upstream tool, the call that created it (call id, evidence
session, execution id) and its last known status.

Every read and write names the owner it acts for, and answers ``None`` for a
task that is unknown or another owner's: the two are one answer, so a task id
says nothing to an agent that does not own it. The owner's agent session is
checked in the same transaction (revoked or expired: refused, whatever the
task id), so a revoked agent session can no longer read or steer its tasks at
any replica. A status moves from live to terminal once; the first terminal
status wins. One task per execution (of an agent): a second creation for its execution id is
a :class:`~bastion.errors.Conflict`.

Unfenced, as agent sessions are: a task row records what an upstream answered,
and a stale replica writing one lets nobody write evidence.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId

__all__ = ["TERMINAL_STATUSES", "NewTask", "TaskRecord", "TaskStatus", "TaskStore"]


class TaskStatus(enum.StrEnum):
    """The 2025-11-25 revision's task statuses."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES: frozenset[TaskStatus] = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
)


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task an upstream just created: its owner, its server and id there, and the call that made it."""

    agent: AgentId
    agent_session_id: str | None
    server: str
    upstream_task_id: str
    call_id: CallId
    evidence_session_id: EvidenceSessionId
    execution_id: ExecutionId | None
    status: TaskStatus = TaskStatus.WORKING
    tool: str | None = None  # the upstream tool of the creating call (grants are re-checked on it)

    def __post_init__(self) -> None:
        if not (self.agent and self.server and self.upstream_task_id and self.call_id):
            raise ValueError("a task needs an agent, a server, an upstream task id and a call")
        if not self.evidence_session_id:
            raise ValueError("a task needs the evidence session of the call that created it")
        object.__setattr__(self, "status", TaskStatus(self.status))


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task: ``task_id`` is the gateway's, ``upstream_task_id`` the upstream's (never shown)."""

    task_id: str
    agent: AgentId
    agent_session_id: str | None
    server: str
    upstream_task_id: str
    call_id: CallId
    evidence_session_id: EvidenceSessionId
    execution_id: ExecutionId | None
    status: TaskStatus
    created_at: datetime
    updated_at: datetime
    tool: str | None = None  # None for a row written before schema 14 (SQLite) / 10 (PostgreSQL)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class TaskStore(Protocol):
    async def create_task(self, task: NewTask, *, now: datetime) -> TaskRecord:
        """Record a task the upstream created, under a fresh random ``task_id``.

        Raises :class:`~bastion.errors.Conflict` when the execution already has a
        task or the server's upstream task id is recorded; ``AgentSessionRevoked``
        / ``AgentSessionExpired`` (as of ``now``) for an agent session that can no
        longer be used.
        """
        ...

    async def get_task(
        self, task_id: str, *, agent: AgentId, agent_session_id: str | None, now: datetime
    ) -> TaskRecord | None:
        """The owner's task, or ``None`` (unknown or another owner's: one answer).

        Raises ``AgentSessionRevoked`` / ``AgentSessionExpired`` for the owner's
        agent session, whatever ``task_id`` is.
        """
        ...

    async def set_task_status(
        self,
        task_id: str,
        status: TaskStatus,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
    ) -> tuple[TaskRecord, bool] | None:
        """Record the status an upstream reported; the record and whether this call changed it.

        A terminal status is final: a later status leaves the row as it is
        (``changed`` is ``False``). ``None`` and raises as :meth:`get_task`.
        """
        ...

    async def task_of_execution(
        self, execution_id: ExecutionId, *, agent: AgentId, agent_session_id: str | None, now: datetime
    ) -> TaskRecord | None:
        """The owner's task that execution ``execution_id`` created, or ``None``; raises as get_task."""
        ...

    async def task_of_upstream(
        self,
        server: str,
        upstream_task_id: str,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
    ) -> TaskRecord | None:
        """The owner's task that ``server`` knows as ``upstream_task_id``, or ``None`` (unknown or
        another owner's: one answer); raises as :meth:`get_task`. For an upstream's status
        notification (``tasks/relay.py``)."""
        ...

    async def list_tasks(
        self,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
        after: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """The owner's tasks, oldest first, at most ``limit``, after task ``after`` when given.

        An ``after`` that is not the owner's task lists nothing. Raises as
        :meth:`get_task`.
        """
        ...
