"""The store contract of execution rows (DESIGN section 3, seed 000).

Part of :class:`~bastion.store.base.Store` (its module docstring draws the fencing model and the
durability rules every write here follows); the records are re-exported there. An execution row
belongs to the generation that reserved it: only a worker of that generation moves it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bastion.admission.states import ExecutionState
from bastion.ids import AgentId, CallId, Epoch, ExecutionId, WorkerId

__all__ = [
    "ExecutionRecord",
    "ExecutionStep",
    "ExecutionStore",
    "Readmitted",
    "RecoveredExecution",
    "ReserveOutcome",
    "Reserved",
]


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """The authoritative row of one ``(agent, execution_id)``.

    ``worker``/``epoch`` name the last writer; ``generation`` the owner.
    ``call_id`` is the attempt that last reserved the row.
    """

    agent: AgentId
    execution_id: ExecutionId
    binding: str
    state: ExecutionState
    call_id: CallId | None
    generation: str
    worker: WorkerId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class Reserved:
    """A new row was inserted ``reserved`` with its binding."""

    record: ExecutionRecord


@dataclass(frozen=True, slots=True)
class Readmitted:
    """A ``released`` row with the same binding was reserved again."""

    record: ExecutionRecord


ReserveOutcome = Reserved | Readmitted


@dataclass(frozen=True, slots=True)
class ExecutionStep:
    """An execution transition written in the same transaction as the audit entries that say so.

    Given to :meth:`Store.append_entries` or :meth:`Store.open_chain`: the row of
    ``(agent, execution_id)`` moves to ``target`` first, exactly as
    :meth:`Store.mark_invoking`/:meth:`Store.record_outcome` would move it (same
    refusals), and the entries are written only if it did: the row and its audit
    entries are durable together or not at all. With ``reserve_binding`` (and
    ``call_id``), the row is first reserved as :meth:`Store.reserve_execution`
    reserves it (same refusals), then moved to ``target`` (``invoking``):
    admission and the durable mark in one write.
    """

    agent: AgentId
    execution_id: ExecutionId
    target: ExecutionState
    reserve_binding: str | None = None
    call_id: CallId | None = None

    def __post_init__(self) -> None:
        if self.target in (ExecutionState.RESERVED, ExecutionState.RELEASED):
            raise ValueError(f"a step moves a row to invoking or a terminal state, not {self.target}")
        if self.reserve_binding is not None and (
            self.target is not ExecutionState.INVOKING or self.call_id is None
        ):
            raise ValueError("a step that reserves first names its call_id and moves the row to invoking")


@dataclass(frozen=True, slots=True)
class RecoveredExecution:
    """One row that :meth:`Store.recover_worker` settled; the caller audits it."""

    agent: AgentId
    execution_id: ExecutionId
    binding: str
    call_id: CallId | None
    previous_state: ExecutionState
    state: ExecutionState
    previous_worker: WorkerId
    previous_epoch: Epoch
    #: The execution's task, still live in the store: the row stays ``invoking`` (``state``).
    task_id: str | None = None


class ExecutionStore(Protocol):
    """One authoritative row per ``(agent, execution_id)``, moved only along the transition table."""

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
        """Atomically classify and, if admissible, reserve ``(agent, execution_id)``.

        - no row: insert ``reserved`` with the immutable ``binding`` → :class:`Reserved`;
        - a row with another binding: raise :class:`ExecutionCollision` (``execution_id``);
        - same binding, ``reserved``/``invoking``: raise :class:`ExecutionInFlight`;
        - same binding, terminal: raise :class:`ExecutionReplay` (``earlier_outcome``);
        - same binding, ``released``: back to ``reserved`` under this writer → :class:`Readmitted`.

        The fence is checked first: a stale writer raises :class:`StaleEpoch`
        and learns nothing about the row.
        """
        ...

    async def mark_invoking(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        """``reserved → invoking``, durable before return, so the call may be sent after it.

        Raises :class:`StaleEpoch`; :class:`Conflict` for a missing row, a row
        of another generation or an illegal transition.
        """
        ...

    async def record_outcome(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        outcome: ExecutionState,
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ExecutionRecord:
        """``invoking → outcome`` (a terminal state), durable before return.

        Raises :class:`ValueError` if ``outcome`` is not terminal; otherwise as
        :meth:`mark_invoking`. If it raises, the row is still ``invoking``
        (unless :class:`NotDurable` came after commit, see the module docstring).
        """
        ...

    async def release_execution(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        """``reserved → released``: only when nothing was sent. Raises as :meth:`mark_invoking`."""
        ...

    async def get_execution(self, agent: AgentId, execution_id: ExecutionId) -> ExecutionRecord | None:
        """The committed row, or ``None``."""
        ...

    async def recover_worker(
        self, dead_worker_generation: str, *, new_worker: WorkerId, new_epoch: Epoch
    ) -> list[RecoveredExecution]:
        """Settle what a dead holder of ``dead_worker_generation`` left, in one transaction.

        ``new_worker`` must hold that generation at ``new_epoch`` (else
        :class:`StaleEpoch`; :class:`Conflict` if it holds another generation).
        Rows of the generation written under an older epoch move
        ``invoking → outcome_unknown`` and ``reserved → released``, rewritten
        under ``(new_worker, new_epoch)``; an ``invoking`` row whose task is
        still live in the store stays ``invoking`` (its task settles it, at any
        replica), rewritten so too, and is returned with its ``task_id``.
        Returns those rows, ordered by ``(agent, execution_id)``; the caller
        writes one audit entry for each.
        """
        ...
