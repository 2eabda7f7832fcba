"""The store contract every engine implements (DESIGN sections 3, 4, 6 and 7).

This module owns the :class:`Store` protocol and the records it returns. It
states what each operation makes atomic and what it raises; the engines
(``sqlite.py`` now, ``postgres.py`` later) follow it, and the contract tests in
``tests/contract/store/`` run the same cases against each. Nothing here may
name an engine: no SQL, no file paths, no driver types.

Fencing model (DESIGN section 6)
--------------------------------
A *worker* is one running gateway replica or upstream runtime. It registers
once under an identity that is never replaced. A *generation* is the slot a
worker claims (``"gateway-0"``, say); claiming it returns the *epoch*, which
rises by one on every takeover. A worker is bound to one generation for its
life, and the store remembers which, so a write names its generation through
its worker: every write that matters takes ``(worker, epoch)``, and the engine
checks, in the same transaction as the write, that ``worker`` is the current
holder of its generation at exactly ``epoch``. Anything else raises :class:`StaleEpoch`
and writes nothing. There is no unfenced mode: a gateway registers a worker
and claims a generation before it writes (a survivor that recovers a dead
replica registers a fresh recovery worker and claims the dead generation).

An execution row belongs to the generation that reserved it: only a worker of
that generation moves it on (anything else raises :class:`Conflict`), and
:meth:`Store.recover_worker` is how a generation's new holder settles what
its dead predecessor left.

Durability and errors
---------------------
Every write returns only once it is durable. A write that cannot be made
durable raises :class:`NotDurable`; the caller cannot know whether it landed
(a lost acknowledgement looks the same), so it must neither repeat an effect
nor report success: the row stays non-terminal as far as it knows, and hence
refused (seed 000). Domain refusals
(collision, in flight, replay) are raised as the ``CallRefused`` errors from
``errors.py``; storage refusals as :class:`StoreError` subclasses. A caller
cancelled while its write is being committed may not learn its result: treat
that like :class:`NotDurable` after commit (the write may have happened).

Agent sessions and credentials (DESIGN sections 1, 2 step 3 and 8)
------------------------------------------------------------------
Admin writes (create, add a credential, revoke, renew) carry **no** worker
fencing, by decision. Fencing keeps a superseded replica from writing over
state that its generation owned (executions, chains); an agent session
belongs to no generation, and each admin write is decided inside its own
transaction from committed rows alone, never from a replica's memory, so a
stale replica has nothing stale to write. Fencing revocation would only
make it fail at a stale replica, and a revocation refused is access kept:
the fail-open direction. What revocation needs is atomicity, and it has it:
one transaction records when, by whom and why, once; every later read sees
it. Who asked is in ``revoked_by``; the caller audits the operation.

Worker registry (DESIGN section 6, issue #5)
--------------------------------------------
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

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from bastion.admission.states import ExecutionState
from bastion.audit.entry import AuditEntry
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.pins import PinStore
from bastion.store.replicas import ReplicaRecords
from bastion.store.tasks import TaskStore
from bastion.store.token_buckets import TokenBucketStore

__all__ = [
    "AgentSessionRecord",
    "AppendBuilder",
    "AttachmentRecord",
    "ChainInfo",
    "CredentialKind",
    "CredentialRecord",
    "ExecutionRecord",
    "ExecutionStep",
    "GenerationBacklog",
    "GenerationRecord",
    "Readmitted",
    "RecoveredExecution",
    "ReserveOutcome",
    "Reserved",
    "Store",
    "WorkerRecord",
]

AppendBuilder = Callable[[int, str], AuditEntry]
"""``build(next_seq, prev_hash) -> sealed AuditEntry``, called inside the append's transaction."""


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


@dataclass(frozen=True, slots=True)
class StoreOwner:
    """A signing key that this store belongs to, and the data directory it was in (issue #23)."""

    key_id: str
    data_dir: str
    joined: datetime


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
    """What a generation's holders left unsettled: executions ``reserved``/``invoking``, chains still open."""

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
    claim is current (see the module docstring). ``transport_session_ref`` is
    an opaque reference, never the ``Mcp-Session-Id`` itself.
    """

    worker_id: WorkerId
    transport_session_ref: str
    namespace: str
    attached_at: datetime
    writer: WorkerId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class AgentSessionRecord:
    """One agent session: the authorization context a credential resolves to.

    Revoked iff ``revoked_at`` is set (then ``revoked_by`` is too); expired iff
    ``now >= expires_at``. ``auth.agent_session.check_agent_session`` decides.
    """

    agent_session_id: str
    human: str
    agent: AgentId
    team: str | None
    scopes: frozenset[str]
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    revoke_reason: str | None


class CredentialKind(enum.StrEnum):
    """What a credential's ``digest`` is the SHA-256 of: a bearer token, or a client certificate (DER)."""

    BEARER = "bearer"
    MTLS = "mtls"


@dataclass(frozen=True, slots=True)
class CredentialRecord:
    """One credential bound to one agent session; ``digest`` is 64 lowercase hex digits.

    A superseded credential (``superseded_at`` set) authenticates nothing;
    ``renewed_from`` names the credential this one replaced.
    """

    credential_id: str
    agent_session_id: str
    kind: CredentialKind
    digest: str
    created_at: datetime
    superseded_at: datetime | None
    renewed_from: str | None


class Store(ReplicaRecords, TokenBucketStore, TaskStore, PinStore, Protocol):
    """The one storage contract. Every method is a coroutine; times are timezone-aware.

    Each write below is one atomic transaction. Engines may commit several
    concurrent writes in one transaction (group commit), but each keeps its own
    atomicity and its own result or error.
    """

    async def aclose(self) -> None:
        """Finish writes in progress and release every connection. Later calls raise :class:`StoreError`."""
        ...

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

    # ------------------------------------------------------------ ownership and health (issue #23)

    async def probe(self, timeout_s: float) -> None:
        """One cheap read that proves the store answers now.

        Raises :class:`StoreError` (with its ``cause`` when one is known) when it
        does not answer, or not within ``timeout_s``.
        """
        ...

    async def store_owners(self) -> list[StoreOwner]:
        """The signing keys this store belongs to, the first one first (``store/ownership.py``)."""
        ...

    async def add_store_owner(self, key_id: str, data_dir: str, *, now: datetime) -> None:
        """Record that the key ``key_id`` (of ``data_dir``) uses this store; a known key is left as it is."""
        ...

    async def get_generation(self, generation: str) -> GenerationRecord | None: ...

    # ------------------------------------------------------------ worker registry (issue #5)
    # Withdrawal and failure are unfenced: see "Worker registry" in the module docstring.

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
        under ``(new_worker, new_epoch)``. Returns the changed rows, ordered by
        ``(agent, execution_id)``; the caller writes one audit entry for each.
        """
        ...

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

    # ------------------------------------------------------------ agent sessions and credentials
    # Unfenced admin writes: see "Agent sessions and credentials" in the module docstring.

    async def create_agent_session(
        self,
        *,
        human: str,
        agent: AgentId,
        team: str | None,
        scopes: frozenset[str],
        now: datetime,
        expires_at: datetime,
    ) -> AgentSessionRecord:
        """Create an agent session with a fresh random id, created at ``now``; it has no credential yet.

        Raises :class:`ValueError` if ``expires_at`` is not after ``now`` or a
        name is empty.
        """
        ...

    async def add_credential(
        self, agent_session_id: str, kind: CredentialKind, digest: str, *, now: datetime
    ) -> CredentialRecord:
        """Bind a new credential (fresh random id) to a live agent session, atomically with checking it.

        Raises :class:`ValueError` for a digest that is not 64 lowercase hex
        digits; :class:`Conflict` for an unknown agent session or a
        ``(kind, digest)`` ever used before; :class:`AgentSessionRevoked` or
        :class:`AgentSessionExpired` (as of ``now``) for a session that can no
        longer be used.
        """
        ...

    async def find_credential(
        self, kind: CredentialKind, digest: str
    ) -> tuple[CredentialRecord, AgentSessionRecord] | None:
        """The credential with this ``(kind, digest)`` and its agent session, read together; or ``None``.

        Superseded credentials are returned too (the caller refuses them), so
        that the audit can name the real cause.
        """
        ...

    async def get_agent_session(self, agent_session_id: str) -> AgentSessionRecord | None: ...

    async def list_agent_sessions(self, *, agent: AgentId | None = None) -> list[AgentSessionRecord]:
        """Every agent session (or only ``agent``'s), oldest first, revoked and expired ones included."""
        ...

    async def list_credentials(self, agent_session_id: str) -> list[CredentialRecord]:
        """The agent session's credentials, oldest first, superseded ones included."""
        ...

    async def revoke_agent_session(
        self, agent_session_id: str, *, by: str, reason: str, now: datetime
    ) -> AgentSessionRecord:
        """Revoke the agent session, atomically and once, and return its record.

        Idempotent: revoking a revoked session changes nothing and returns the
        first revocation (its time, actor and reason). An expired session can
        be revoked. Raises :class:`Conflict` for an unknown agent session and
        :class:`ValueError` for an empty ``by``.
        """
        ...

    async def renew_credential(
        self, old_credential_id: str, new_digest: str, *, now: datetime
    ) -> CredentialRecord:
        """Supersede ``old_credential_id`` at ``now`` and bind a new credential of the same kind, atomically.

        The old credential stops authenticating in the same transaction as the
        new one starts; the agent session (and any transport session) is
        unchanged: renewal extends nothing. A credential is renewed once:
        concurrent renewals of one credential have one winner. Raises
        :class:`ValueError` for a malformed digest; :class:`Conflict` for an
        unknown or already superseded credential, or a ``(kind, digest)`` used
        before; :class:`AgentSessionRevoked` / :class:`AgentSessionExpired`
        (as of ``now``) when its agent session can no longer be used.
        """
        ...
