"""The store contract of audit chains and their claims (DESIGN section 7).

Part of :class:`~bastion.store.base.Store` (its module docstring draws the fencing model and the
durability rules every write here follows); the records are re-exported there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bastion.audit.entry import AuditEntry
from bastion.ids import AgentId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.executions import ExecutionStep

__all__ = ["AppendBuilder", "ChainInfo", "ChainStore"]

AppendBuilder = Callable[[int, str], AuditEntry]
"""``build(next_seq, prev_hash) -> sealed AuditEntry``, called inside the append's transaction."""


@dataclass(frozen=True, slots=True)
class ChainInfo:
    """One audit chain (one evidence session): its owner, root and head."""

    session_id: EvidenceSessionId
    agent: AgentId | None
    root: str
    head_seq: int
    head_hash: str
    generation: str
    closed: bool


class ChainStore(Protocol):
    """One audit chain per evidence session: opened, appended to in order, closed with its claim."""

    # ------------------------------------------------------------ audit chains

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
        """With ``then``, those sealed entries (seq 1, 2, ...) are written in the same transaction;
        with ``closed_with_claim`` (the last of ``then`` being the close entry) the chain is
        written closed, with its claim: a whole short-lived chain in one transaction. With
        ``step``, that execution transition is made in it too, first (see :class:`ExecutionStep`).

        Create the chain with its sealed genesis entry (``seq`` 0, ``prev`` 64 zeros) as root.

        The chain's owner is ``genesis.agent``. Raises :class:`Conflict` if the
        chain exists, :class:`StaleEpoch`, and :class:`ValueError` for a
        genesis that is unsealed or not the first link of ``session_id``.
        """
        ...

    async def append_entry(
        self, session_id: EvidenceSessionId, build: AppendBuilder, *, worker: WorkerId, epoch: Epoch
    ) -> AuditEntry:
        """Append ``build(head_seq + 1, head_hash)`` to the chain, atomically with reading its head.

        Concurrent appends to one chain therefore never fork or leave a gap.
        ``build`` must be pure and quick: it runs while the chain is locked,
        possibly on a worker thread, and may be called again with the same
        arguments if the engine retries. Raises :class:`Conflict` for an
        unknown or closed chain, :class:`StaleEpoch`, and :class:`ValueError`
        if the built entry is unsealed or is not that chain's next link.
        Whatever ``build`` raises is raised, and nothing is written.
        """
        ...

    async def append_entries(
        self,
        session_id: EvidenceSessionId,
        builds: Sequence[AppendBuilder],
        *,
        worker: WorkerId,
        epoch: Epoch,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        """Append one entry per builder, in order, all or none, in one transaction.

        Exactly :meth:`append_entry` applied to each builder in turn, atomically
        together (one fsync for one call's entries). Raises as :meth:`append_entry`.
        With ``step``, that execution transition is made first, in the same
        transaction, and raises as its own operation would (then nothing is written):
        see :class:`ExecutionStep`.
        """
        ...

    async def read_chain(
        self, session_id: EvidenceSessionId, *, start_seq: int = 0, limit: int | None = None
    ) -> list[AuditEntry]:
        """Committed entries with ``seq >= start_seq`` in ``seq`` order (at most ``limit``); page with it."""
        ...

    async def get_chain(self, session_id: EvidenceSessionId) -> ChainInfo | None:
        """The chain's owner, root and head, or ``None``: read paths check ownership with it."""
        ...

    async def find_entries(
        self, execution_id: ExecutionId, *, agent: AgentId | None = None, limit: int = 10_000
    ) -> list[AuditEntry]:
        """Committed entries that carry ``execution_id`` (of ``agent`` only, when given), in every chain.

        Ordered by ``(ts, session_id, seq)``; at most ``limit``. Finds an execution's attempts,
        the entries a recovering worker wrote, and entries written late (issue #11 point 11).
        """
        ...

    async def list_open_chains(self, *, generation: str | None = None) -> list[ChainInfo]:
        """Chains not yet closed (optionally only those a generation opened), for recovery."""
        ...

    async def close_chain(
        self,
        session_id: EvidenceSessionId,
        *,
        worker: WorkerId,
        epoch: Epoch,
        final: AppendBuilder | None = None,
        claim_for: Callable[[AuditEntry], Mapping[str, Any]] | None = None,
    ) -> ChainInfo:
        """With ``claim_for``, the claim it makes from the close entry is stored in the
        same transaction (as :meth:`store_claim` would), so a closed chain and its claim
        land together.

        Close the chain (later appends raise :class:`Conflict`) and return its final head.

        With ``final``, the close entry it builds is appended in the same
        transaction, exactly as :meth:`append_entry` would, so no chain is ever
        left with a close entry but still open. Raises :class:`Conflict` if
        unknown or already closed, :class:`StaleEpoch`, and what
        :meth:`append_entry` raises for ``final``.
        """
        ...

    async def store_claim(
        self,
        session_id: EvidenceSessionId,
        claim: Mapping[str, Any],
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> None:
        """Store the TRACE claim of a closed chain under its session id (JSON object, once).

        Raises :class:`Conflict` if the chain is unknown or still open, or
        already has a claim; :class:`StaleEpoch`.
        """
        ...

    async def get_claim(self, session_id: EvidenceSessionId) -> dict[str, Any] | None: ...
