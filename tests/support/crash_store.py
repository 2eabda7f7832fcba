"""A store that kills its own process at a chosen durable step, for crash-recovery tests (seed 000).

``CrashingStore(inner, kill_after="mark_invoking")`` wraps any
:class:`~bastion.store.base.Store`, passes every call through (the four
execution transitions explicitly, everything else by delegation, so the
wrapper never falls behind the contract), and sends ``SIGKILL`` to the current
process at one step of an execution's life:

- ``kill_after="<op>"``: right after ``<op>`` returned, so its write is durable
  and nothing after it happened (``reserve_execution``: reserved, nothing sent;
  ``mark_invoking``: invoking is durable, nothing sent; ``record_outcome``: the
  terminal state is durable, no answer given);
- ``kill_after="before:<op>"``: right before ``<op>`` runs
  (``before:record_outcome``: the upstream answered, the terminal write never
  happened).

A chain write that carries an execution transition (``step``: the durable
``invoking`` mark or the terminal state, written with their audit entries in
one transaction) is that transition's step here.

Only calls that carry an execution id trigger it (``execution_id`` narrows it to
one value, ``agent`` to one agent), so start-up writes never do. The kill is
the real ``kill -9`` of DESIGN section 3's recovery rule: no ``finally`` runs,
no connection is closed, no buffer is flushed. ``kill`` is a parameter so the
wrapper itself can be tested without dying. Never use it outside tests.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args

from bastion.admission.states import ExecutionState
from bastion.audit.entry import AuditEntry
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.base import (
    AppendBuilder,
    ChainInfo,
    ExecutionRecord,
    ExecutionStep,
    ReserveOutcome,
    Store,
)

__all__ = ["BEFORE_PREFIX", "CrashOp", "CrashingStore", "parse_kill_point"]

T = TypeVar("T")

CrashOp = Literal["reserve_execution", "mark_invoking", "record_outcome", "release_execution"]
BEFORE_PREFIX = "before:"


def parse_kill_point(kill_after: str) -> tuple[CrashOp, bool]:
    """``"before:record_outcome"`` → ``("record_outcome", True)``; raises ``ValueError`` for an unknown op."""
    before = kill_after.startswith(BEFORE_PREFIX)
    op = kill_after.removeprefix(BEFORE_PREFIX)
    if op not in get_args(CrashOp):
        raise ValueError(f"unknown kill point {kill_after!r}; ops: {', '.join(get_args(CrashOp))}")
    return op, before  # type: ignore[return-value]


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingStore:
    """Wraps ``inner`` and kills the process at ``kill_after`` for a matching execution."""

    def __init__(
        self,
        inner: Store,
        kill_after: str,
        *,
        execution_id: str | None = None,
        agent: str | None = None,
        kill: Callable[[], None] = _sigkill,
    ) -> None:
        self.inner = inner
        self.op, self.before = parse_kill_point(kill_after)
        self._execution_id = execution_id
        self._agent = agent
        self._kill = kill

    def _matches(self, op: CrashOp, agent: AgentId, execution_id: ExecutionId) -> bool:
        return (
            op == self.op
            and (self._execution_id is None or execution_id == self._execution_id)
            and (self._agent is None or agent == self._agent)
        )

    async def _guard(
        self, op: CrashOp, agent: AgentId, execution_id: ExecutionId, call: Callable[[], Awaitable[T]]
    ) -> T:
        if not self._matches(op, agent, execution_id):
            return await call()
        if self.before:
            self._kill()
        result = await call()
        if not self.before:
            self._kill()
        return result

    async def append_entries(
        self,
        session_id: EvidenceSessionId,
        builds: Sequence[AppendBuilder],
        *,
        worker: WorkerId,
        epoch: Epoch,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        def call() -> Awaitable[list[AuditEntry]]:
            return self.inner.append_entries(session_id, builds, worker=worker, epoch=epoch, step=step)

        return await self._step_guard(step, call)

    async def open_chain(
        self,
        session_id: EvidenceSessionId,
        genesis: AuditEntry,
        *,
        worker: WorkerId,
        epoch: Epoch,
        then: Sequence[AuditEntry] = (),
        closed_with_claim: Mapping[str, Any] | None = None,
        step: ExecutionStep | None = None,
    ) -> ChainInfo:
        def call() -> Awaitable[ChainInfo]:
            return self.inner.open_chain(
                session_id,
                genesis,
                worker=worker,
                epoch=epoch,
                then=then,
                closed_with_claim=closed_with_claim,
                step=step,
            )

        return await self._step_guard(step, call)

    async def _step_guard(self, step: ExecutionStep | None, call: Callable[[], Awaitable[T]]) -> T:
        """A chain write carrying an execution transition is that transition's step (and, when
        it reserves first, the reservation's too: the kill comes before or after the one write)."""
        if step is None:
            return await call()
        ops: tuple[CrashOp, ...] = ("record_outcome",)
        if step.target is ExecutionState.INVOKING:
            ops = ("reserve_execution", "mark_invoking") if step.reserve_binding else ("mark_invoking",)
        op = self.op if self.op in ops else ops[0]
        return await self._guard(op, step.agent, step.execution_id, call)

    def __getattr__(self, name: str) -> Any:
        # Every other operation passes straight through: this wrapper intercepts the four
        # execution transitions only, and must not fall behind as the store contract grows.
        return getattr(self.inner, name)

    # ------------------------------------------------------------ executions

    async def reserve_execution(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        binding: str,
        *,
        call_id: CallId,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ReserveOutcome:
        return await self._guard(
            "reserve_execution",
            agent,
            execution_id,
            lambda: self.inner.reserve_execution(
                agent, execution_id, binding, call_id=call_id, worker=worker, epoch=epoch
            ),
        )

    async def mark_invoking(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        return await self._guard(
            "mark_invoking",
            agent,
            execution_id,
            lambda: self.inner.mark_invoking(agent, execution_id, worker=worker, epoch=epoch),
        )

    async def record_outcome(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        outcome: ExecutionState,
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ExecutionRecord:
        return await self._guard(
            "record_outcome",
            agent,
            execution_id,
            lambda: self.inner.record_outcome(agent, execution_id, outcome, worker=worker, epoch=epoch),
        )

    async def release_execution(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        return await self._guard(
            "release_execution",
            agent,
            execution_id,
            lambda: self.inner.release_execution(agent, execution_id, worker=worker, epoch=epoch),
        )


def _conforms(store: CrashingStore) -> Store:
    """Let mypy check the intercepted methods against the contract (the rest is delegated)."""
    return store
