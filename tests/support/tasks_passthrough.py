"""Pass :class:`~bastion.store.tasks.TaskStore` through a wrapping store unchanged (issue 24)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from bastion.ids import AgentId, ExecutionId
from bastion.store.tasks import NewTask, TaskRecord, TaskStatus, TaskStore

__all__ = ["TaskStorePassthrough"]


class _Wrapper(Protocol):
    @property
    def inner(self) -> TaskStore: ...


class TaskStorePassthrough:
    """Mixin: every task call goes to ``self.inner``."""

    async def create_task(self: _Wrapper, task: NewTask, *, now: datetime) -> TaskRecord:
        return await self.inner.create_task(task, now=now)

    async def get_task(
        self: _Wrapper, task_id: str, *, agent: AgentId, agent_session_id: str | None, now: datetime
    ) -> TaskRecord | None:
        return await self.inner.get_task(task_id, agent=agent, agent_session_id=agent_session_id, now=now)

    async def task_of_execution(
        self: _Wrapper,
        execution_id: ExecutionId,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
    ) -> TaskRecord | None:
        return await self.inner.task_of_execution(
            execution_id, agent=agent, agent_session_id=agent_session_id, now=now
        )

    async def task_of_upstream(
        self: _Wrapper,
        server: str,
        upstream_task_id: str,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
    ) -> TaskRecord | None:
        return await self.inner.task_of_upstream(
            server, upstream_task_id, agent=agent, agent_session_id=agent_session_id, now=now
        )

    async def set_task_status(
        self: _Wrapper,
        task_id: str,
        status: TaskStatus,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
    ) -> tuple[TaskRecord, bool] | None:
        return await self.inner.set_task_status(
            task_id, status, agent=agent, agent_session_id=agent_session_id, now=now
        )

    async def list_tasks(
        self: _Wrapper,
        *,
        agent: AgentId,
        agent_session_id: str | None,
        now: datetime,
        after: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        return await self.inner.list_tasks(
            agent=agent, agent_session_id=agent_session_id, now=now, after=after, limit=limit
        )
