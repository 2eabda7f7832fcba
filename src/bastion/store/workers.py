"""The store contract of workers, generations and attachment records (DESIGN section 6, issue #5).

Part of :class:`~bastion.store.base.Store` (its module docstring draws the fencing model every
write here follows); the records are re-exported there.

Liveness is heartbeat freshness alone, with two ways to lose it early and for
good: :meth:`Store.withdraw_liveness` (the worker's PID is known dead on its
host) and :meth:`Store.mark_worker_failed` (a failure scoped to that one
identity). Neither is fenced, by decision: each only ever *removes* liveness,
the fail-closed direction. It can make a generation claimable sooner and a
holder superseded sooner (it then learns so at its next heartbeat); it never
lets any writer write. A withdrawal is also made by a gateway that has not
claimed its own generation yet (``workers/withdrawal.withdraw_if_dead`` before a
claim), which has no epoch to show. Nothing ever restores liveness once
withdrawn: not a heartbeat, not a live PID.

Session ownership is kept apart from launch provenance: provenance is what
:meth:`Store.register_worker` recorded; ownership is an *attachment record*
(which client transport session uses which worker for which namespace now),
written and cleared under the writer's ``(worker, epoch)`` like every write
that matters. A record proves ownership only while its writer still holds its
claim at that epoch and both workers are live; otherwise ownership reads
``unproven`` (``workers/registry.py`` decides), never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from bastion.ids import Epoch, WorkerId

__all__ = ["AttachmentRecord", "GenerationBacklog", "GenerationRecord", "WorkerRecord", "WorkerStore"]


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One registered worker identity: its launch provenance, heartbeat and claim.

    ``epoch`` is what its last claim returned (``None`` before any claim); it
    is current only while :class:`GenerationRecord` names this worker as
    holder. ``withdrawn_at`` (PID known dead) and ``failed_at`` (a failure of
    this identity) each end its liveness for good.
    """

    worker_id: WorkerId
    role: str
    provenance: Mapping[str, Any]
    registered_at: datetime
    heartbeat_at: datetime
    generation: str | None
    epoch: Epoch | None = None
    withdrawn_at: datetime | None = None
    withdraw_reason: str | None = None
    failed_at: datetime | None = None
    failure_reason: str | None = None

    def is_live(self, now: datetime, lease_s: float) -> bool:
        """Heartbeat freshness decides: live iff ``now - heartbeat_at < lease_s``, unless withdrawn or failed.

        A withdrawn or failed record is never live again, however fresh its
        heartbeat. (A PID that is alive never makes a record live:
        ``workers/liveness.py``.)
        """
        if self.withdrawn_at is not None or self.failed_at is not None:
            return False
        return (now - self.heartbeat_at).total_seconds() < lease_s


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    generation: str
    holder: WorkerId
    epoch: Epoch
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class GenerationBacklog:
    """What a generation's holders left unsettled: executions ``reserved``/``invoking`` (not one a live
    task holds: its task settles it, at any replica), chains still open."""

    generation: str
    unsettled_executions: int
    open_chains: int

    @property
    def empty(self) -> bool:
        return self.unsettled_executions == 0 and self.open_chains == 0


@dataclass(frozen=True, slots=True)
class AttachmentRecord:
    """Session ownership: a transport session uses ``worker_id`` for ``namespace`` since ``attached_at``.

    Written by ``writer`` at ``epoch``; it proves ownership only while that
    claim is current (see the module docstring of ``store/base.py``). ``transport_session_ref`` is
    an opaque reference, never the ``Mcp-Session-Id`` itself.
    """

    worker_id: WorkerId
    transport_session_ref: str
    namespace: str
    attached_at: datetime
    writer: WorkerId
    epoch: Epoch


class WorkerStore(Protocol):
    """Workers, their generations and what they own: every write here is one atomic transaction."""

    # ------------------------------------------------------------ workers and fencing

    async def register_worker(
        self, worker_id: WorkerId, role: str, provenance: Mapping[str, Any], *, now: datetime
    ) -> WorkerRecord:
        """Register a new worker identity, its heartbeat set to ``now``.

        Raises :class:`Conflict` if the identity exists: identities are never
        replaced, adopted or merged.
        """
        ...

    async def claim_generation(
        self, generation: str, worker_id: WorkerId, *, now: datetime, lease_s: float
    ) -> Epoch:
        """Claim ``generation`` for ``worker_id``, atomically, and return the new epoch.

        An unclaimed generation starts at epoch 1. A held one is taken over
        with ``epoch = previous + 1`` only if its holder is not live (its last
        heartbeat is ``lease_s`` or more before ``now``, or its liveness was
        withdrawn or it failed); the claimant's heartbeat becomes ``now``.
        Raises :class:`Conflict` when the holder is live (the claimant itself
        included), when the worker is unknown, withdrawn or failed, or when it
        was ever bound to another generation: a worker claims one generation in
        its life (it may claim that one again after losing it).
        """
        ...

    async def heartbeat(self, worker_id: WorkerId, now: datetime) -> None:
        """Record that ``worker_id`` is alive at ``now`` (never moves backwards).

        Raises :class:`Conflict` for an unknown worker and :class:`StaleEpoch`
        for one whose generation was taken over, or whose liveness was
        withdrawn or that failed: such a worker cannot make itself live again.
        """
        ...

    async def get_worker(self, worker_id: WorkerId) -> WorkerRecord | None: ...

    async def get_generation(self, generation: str) -> GenerationRecord | None: ...

    # ------------------------------------------------------------ worker registry (issue #5)
    # Withdrawal and failure are unfenced: see this module's docstring.

    async def list_workers(self) -> list[WorkerRecord]:
        """Every registered worker, oldest first (withdrawn, failed and superseded ones included)."""
        ...

    async def list_generations(self) -> list[GenerationRecord]:
        """Every claimed generation with its current holder and epoch, by name."""
        ...

    async def withdraw_liveness(self, worker_id: WorkerId, *, now: datetime, reason: str) -> WorkerRecord:
        """Withdraw ``worker_id``'s liveness at once and for good (its PID is known dead); returns its record.

        Its generation may be claimed immediately; its heartbeat can never make
        it live again. Idempotent: the first withdrawal's time and reason stay.
        Raises :class:`Conflict` for an unknown worker, :class:`ValueError` for
        an empty ``reason``.
        """
        ...

    async def mark_worker_failed(self, worker_id: WorkerId, reason: str, now: datetime) -> WorkerRecord:
        """Record a failure of this one identity (never its namespace or fleet); returns its record.

        A failed worker is not live and never becomes live again, so its slot
        may be claimed by its replacement (a new identity, a higher epoch).
        Idempotent: the first failure's time and reason stay. Raises
        :class:`Conflict` for an unknown worker, :class:`ValueError` for an
        empty ``reason``.
        """
        ...

    async def generation_backlog(self, generation: str) -> GenerationBacklog:
        """What recovery would settle in ``generation``: executions reserved or invoking, chains open."""
        ...

    async def record_attachment(
        self,
        worker_id: WorkerId,
        transport_session_ref: str,
        namespace: str,
        now: datetime,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> AttachmentRecord:
        """Record that ``transport_session_ref`` uses ``worker_id`` for ``namespace`` now, fenced.

        Replaces an earlier record of the same triple (its writer and time
        become this write's). Raises :class:`StaleEpoch` (checked first, so a
        stale writer writes nothing), :class:`Conflict` for an unknown
        ``worker_id``, :class:`ValueError` for an empty reference or namespace.
        """
        ...

    async def clear_attachment(
        self,
        worker_id: WorkerId,
        transport_session_ref: str,
        namespace: str,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> bool:
        """Delete that attachment record, fenced; returns whether one existed. Raises :class:`StaleEpoch`."""
        ...

    async def list_attachments(
        self, worker_id: WorkerId | None = None, *, transport_session_ref: str | None = None
    ) -> list[AttachmentRecord]:
        """Attachment records (of one worker, of one transport session, or all), oldest first.

        Records, not verdicts: whether one still proves ownership depends on
        its writer's claim and both workers' liveness (``workers/registry.py``).
        """
        ...
