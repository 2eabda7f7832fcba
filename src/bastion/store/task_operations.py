"""The task contract (``store/tasks.py``) over any engine's ``_write`` and ``_read`` (issue 24)."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import TypeVar

from bastion.ids import AgentId, ExecutionId
from bastion.store.ops import tasks
from bastion.store.rows import to_us
from bastion.store.statements import OpFactory
from bastion.store.tasks import NewTask, TaskRecord, TaskStatus

__all__ = ["TaskOperations", "new_task_id"]

T = TypeVar("T")


def new_task_id() -> str:
    """A fresh task id a client sees: 128 random bits, nothing of the upstream's id or the owner."""
    return "task_" + secrets.token_hex(16)


class TaskOperations:
    """Mixin of :class:`~bastion.store.operations.StoreOperations`: the task methods."""

    async def _write(self, op: OpFactory[T]) -> T:
        raise NotImplementedError

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        raise NotImplementedError

    async def create_task(self, task: NewTask, *, now: datetime) -> TaskRecord:
        task_id, now_us = new_task_id(), to_us(now)
        return await self._write(lambda: tasks.create_task(task_id, task, now, now_us))

    async def get_task(
        self, task_id: str, *, agent: AgentId, agent_session_id: str | None, now: datetime
    ) -> TaskRecord | None:
        return await self._read(lambda: tasks.get_task(task_id, agent, agent_session_id, now), snapshot=True)

    async def task_of_execution(
        self, execution_id: ExecutionId, *, agent: AgentId, agent_session_id: str | None, now: datetime
    ) -> TaskRecord | None:
        return await self._read(
            lambda: tasks.task_of_execution(execution_id, agent, agent_session_id, now), snapshot=True
        )

    async def task_of_upstream(
        self,
        server: str,
        upstream_task_id: str,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
    ) -> TaskRecord | None:
        return await self._read(
            lambda: tasks.task_of_upstream(server, upstream_task_id, agent, agent_session_id, now),
            snapshot=True,
        )

    async def set_task_status(
        self,
        task_id: str,
        status: TaskStatus,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
    ) -> tuple[TaskRecord, bool] | None:
        status, now_us = TaskStatus(status), to_us(now)
        return await self._write(
            lambda: tasks.set_task_status(task_id, status, agent, agent_session_id, now, now_us)
        )

    async def list_tasks(
        self,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
        after: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._read(
            lambda: tasks.list_tasks(agent, agent_session_id, now, after, limit), snapshot=True
        )
