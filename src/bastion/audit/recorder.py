"""Evidence sessions at run time: open, append, rotate, close with a TRACE claim (DESIGN sections 1 and 4).

An :class:`EvidenceSession` is one audit chain scoped to a session-era
transport session, or to one sessionless request. Opening writes the genesis
entry (seq 0, committing to the signing key id, the session, the agent and a
nonce) and the attestation entry (seq 1: the chain root bound into TEE
``report_data`` where configfs-tsm exists, else ``kind: none`` with the
reason). Appends go through the store, which reads the head and writes the
next link in one transaction, so concurrent calls never fork a chain.
Before an append, a session past its entry or age bound is rotated: closed
(reason ``rotation``, claim issued) and replaced by a fresh chain, so every
claim is bounded and prompt.

The entry bound is exact (issue #11 point 14): ``max_entries`` counts every
entry of a chain, genesis, attestation and close included, so no chain ever
holds more. One call's entries never span two chains: a call's first write
says how many entries it may still write (``then``), those slots are held for
it, and the chain rotates *before* a call's first entry when that entry, the
slots held and the close would not fit. While other calls hold slots in the
chain, a call that does not fit waits for them to finish (their holds end
with :meth:`EvidenceRecorder.end_call`), then rotates. The smallest bound is
:data:`MIN_MAX_ENTRIES`: genesis, attestation, one call's three entries, close.

Closing appends the close entry and closes the chain in one transaction,
then issues and stores the signed claim.

Every write carries this worker's ``(worker, epoch)``: a superseded worker
writes nothing (``StaleEpoch``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from bastion.admission.states import ExecutionState
from bastion.audit.chain import ChainSummary, CloseReason, attestation_entry, link_entry, make_genesis
from bastion.audit.claim import ClaimProfile, PolicyInForce, issue_claim
from bastion.audit.entry import AuditEntry, AuditEvent
from bastion.crypto.keys import Keyring
from bastion.ids import AgentId, EvidenceSessionId, new_evidence_session_id
from bastion.store.base import ExecutionStep, Store
from bastion.workers.membership import WorkerMembership

__all__ = ["MIN_MAX_ENTRIES", "Attestor", "EvidenceRecorder", "EvidenceSession"]

#: genesis + attestation + the most one call writes (admitted, invoking, outcome) + close.
MIN_MAX_ENTRIES = 6

logger = logging.getLogger(__name__)

Attestor = Callable[[str], dict[str, Any]]


@dataclass(eq=False)
class EvidenceSession:
    """The live chain of one evidence scope; rotation swaps the chain behind the same handle."""

    agent: AgentId
    session_id: EvidenceSessionId
    genesis: AuditEntry
    attestation: AuditEntry
    opened_at: float
    entries: int = 2
    closed: bool = False
    claim: dict[str, Any] | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    # A deferred session (one sessionless request) is sealed in memory and written in one
    # transaction: at its first durable append, or with its close and claim.
    persisted: bool = True
    buffered: list[AuditEntry] = field(default_factory=list)
    # Slots held in this chain by calls that wrote their first entries here (call_id -> count).
    holds: dict[str, int] = field(default_factory=dict)
    holds_ended: anyio.Event = field(default_factory=anyio.Event)

    @property
    def head(self) -> AuditEntry:
        return self.buffered[-1] if self.buffered else self.attestation


class EvidenceRecorder:
    """Writes the audit chains of one gateway process."""

    def __init__(
        self,
        store: Store,
        keyring: Keyring,
        membership: WorkerMembership,
        *,
        attest: Attestor,
        profile: ClaimProfile,
        policy: Callable[[], PolicyInForce],
        max_entries: int = 10_000,
        max_age_s: float = 3600.0,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < MIN_MAX_ENTRIES:
            raise ValueError(f"an evidence session needs room for at least {MIN_MAX_ENTRIES} entries")
        self._store = store
        self._keyring = keyring
        self._membership = membership
        self._attest = attest
        self._profile = profile
        self._policy = policy
        self._max_entries = max_entries
        self._max_age_s = max_age_s
        self._now = wall_clock
        self._monotonic = monotonic

    def now(self) -> datetime:
        """The wall clock this recorder stamps entries with."""
        return self._now()

    # ------------------------------------------------------------------ open / close

    async def open(self, agent: AgentId, *, policy_version: str | None = None) -> EvidenceSession:
        """Open a new chain for ``agent``. Raises ``StoreError`` (incl. ``StaleEpoch``, ``NotDurable``)."""
        session_id, genesis, attestation = await self._open_chain(agent, policy_version)
        return EvidenceSession(agent, session_id, genesis, attestation, self._monotonic())

    def prepare(self, agent: AgentId, *, policy_version: str | None = None) -> EvidenceSession:
        """A chain sealed in memory and not yet written (see :class:`EvidenceSession`)."""
        session_id, genesis, attestation = self._first_links(agent, policy_version)
        return EvidenceSession(agent, session_id, genesis, attestation, self._monotonic(), persisted=False)

    def _first_links(
        self, agent: AgentId, policy_version: str | None
    ) -> tuple[EvidenceSessionId, AuditEntry, AuditEntry]:
        worker, epoch = self._membership.credentials()
        session_id = new_evidence_session_id()
        genesis = make_genesis(
            session_id=session_id,
            agent=agent,
            key_id=self._keyring.key_id,
            at=self._now(),
            policy_version=policy_version,
            worker=worker,
            epoch=epoch,
        )
        assert genesis.hash is not None
        record = self._attest(genesis.hash)
        attestation = attestation_entry(genesis, record, at=self._now(), worker=worker, epoch=epoch)
        return session_id, genesis, attestation

    async def _open_chain(
        self, agent: AgentId, policy_version: str | None
    ) -> tuple[EvidenceSessionId, AuditEntry, AuditEntry]:
        # The attestation is made from the genesis hash before anything is written, so the
        # chain opens with both its first links in one transaction.
        session_id, genesis, attestation = self._first_links(agent, policy_version)
        worker, epoch = self._membership.credentials()
        await self._store.open_chain(session_id, genesis, worker=worker, epoch=epoch, then=(attestation,))
        return session_id, genesis, attestation

    async def close(self, evidence: EvidenceSession, reason: CloseReason) -> dict[str, Any] | None:
        """Close the chain with ``reason`` and store its signed claim; idempotent."""
        async with evidence.lock:
            if evidence.closed:
                return evidence.claim
            if evidence.persisted:
                evidence.claim = await self._close_chain(evidence, reason)
            else:
                evidence.claim = await self._write_closed_chain(evidence, reason)
            evidence.closed = True
            return evidence.claim

    async def _write_closed_chain(self, evidence: EvidenceSession, reason: CloseReason) -> dict[str, Any]:
        """A deferred chain, from genesis to close and claim, in one transaction."""
        worker, epoch = self._membership.credentials()
        head = evidence.head
        assert head.hash is not None
        closing = _entry(
            head.seq + 1,
            head.hash,
            evidence.session_id,
            evidence.agent,
            AuditEvent.SESSION_CLOSE,
            self._now(),
            worker=worker,
            epoch=epoch,
            detail={"close_reason": CloseReason(reason).value},
        )
        summary = ChainSummary.of(evidence.genesis, evidence.attestation, closing)
        claim = issue_claim(
            summary,
            profile=self._profile,
            policy=self._policy(),
            keyring=self._keyring,
            issued_at=self._now(),
        )
        await self._store.open_chain(
            evidence.session_id,
            evidence.genesis,
            worker=worker,
            epoch=epoch,
            then=(evidence.attestation, *evidence.buffered, closing),
            closed_with_claim=claim,
        )
        evidence.persisted = True
        evidence.buffered = []
        return claim

    async def _append_deferred(
        self,
        evidence: EvidenceSession,
        batch: list[tuple[AuditEvent, dict[str, Any]]],
        durable: bool,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        worker, epoch = self._membership.credentials()
        at = self._now()
        entries: list[AuditEntry] = []
        for event, fields in batch:
            head = entries[-1] if entries else evidence.head
            assert head.hash is not None
            entries.append(
                _entry(
                    head.seq + 1,
                    head.hash,
                    evidence.session_id,
                    evidence.agent,
                    event,
                    at,
                    worker=worker,
                    epoch=epoch,
                    **fields,
                )
            )
        if durable:
            # Needed before something irreversible (a send): write the chain so far, now.
            await self._store.open_chain(
                evidence.session_id,
                evidence.genesis,
                worker=worker,
                epoch=epoch,
                then=(evidence.attestation, *evidence.buffered, *entries),
                step=step,
            )
            evidence.persisted = True
            evidence.buffered = []
        else:
            evidence.buffered.extend(entries)
        evidence.entries += len(entries)
        return entries

    async def _close_chain(self, evidence: EvidenceSession, reason: CloseReason) -> dict[str, Any]:
        worker, epoch = self._membership.credentials()

        def final(seq: int, prev: str) -> AuditEntry:
            entry = _entry(
                seq,
                prev,
                evidence.session_id,
                evidence.agent,
                AuditEvent.SESSION_CLOSE,
                self._now(),
                worker=worker,
                epoch=epoch,
                detail={"close_reason": CloseReason(reason).value},
            )
            return entry

        claims: list[dict[str, Any]] = []

        def claim_for(close: AuditEntry) -> dict[str, Any]:
            summary = ChainSummary.of(evidence.genesis, evidence.attestation, close)
            claim = issue_claim(
                summary,
                profile=self._profile,
                policy=self._policy(),
                keyring=self._keyring,
                issued_at=self._now(),
            )
            claims.append(claim)
            return claim

        # The close entry, the closed flag and the signed claim land in one transaction.
        await self._store.close_chain(
            evidence.session_id, worker=worker, epoch=epoch, final=final, claim_for=claim_for
        )
        claim = claims[-1]
        return claim

    # ------------------------------------------------------------------ append

    async def append(self, evidence: EvidenceSession, event: AuditEvent, **fields: Any) -> AuditEntry:
        """Append one entry (rotating first when the chain reached its bound); returns it sealed.

        ``fields`` are the entry's call fields (``call_id``, ``execution_id``, ``server``, ...).
        Raises ``StoreError`` and never writes a partial entry.
        """
        async with evidence.lock:
            await self._make_room(evidence, fields.get("call_id"), 1, then=0)
            worker, epoch = self._membership.credentials()
            at = self._now()

            def build(seq: int, prev: str) -> AuditEntry:
                return _entry(
                    seq,
                    prev,
                    evidence.session_id,
                    evidence.agent,
                    event,
                    at,
                    worker=worker,
                    epoch=epoch,
                    **fields,
                )

            entry = await self._store.append_entry(evidence.session_id, build, worker=worker, epoch=epoch)
            evidence.entries += 1
            return entry

    async def append_many(
        self,
        evidence: EvidenceSession,
        batch: list[tuple[AuditEvent, dict[str, Any]]],
        *,
        durable: bool = True,
        then: int = 0,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        """Append several entries in order (rotating first if due); one store write when the store can.

        With ``step``, that execution transition is written in the same transaction as the
        entries (``store/base.py`` :class:`ExecutionStep`), so always durably, now.

        On a deferred session, ``durable=False`` only seals the entries in memory: they are
        written with the session's close (which the caller makes happen before its answer).
        ``then`` is how many more entries the batch's call may write to this chain: they are
        held for it (see the module docstring) until it writes them or :meth:`end_call`.
        """
        async with evidence.lock:
            if evidence.closed:
                raise RuntimeError("evidence session is closed")
            call_id = batch[0][1].get("call_id") if batch else None
            if not evidence.persisted:
                # One request's own chain: never rotated; the hold only marks the call's later entries.
                if call_id is not None:
                    if then:
                        evidence.holds[call_id] = then
                    else:
                        evidence.holds.pop(call_id, None)
                return await self._append_deferred(evidence, batch, durable or step is not None, step)
            await self._make_room(evidence, call_id, len(batch), then=then)
            worker, epoch = self._membership.credentials()
            at = self._now()
            builders = [
                _builder(evidence.session_id, evidence.agent, event, at, worker, epoch, fields)
                for event, fields in batch
            ]
            entries = await self._store.append_entries(
                evidence.session_id, builders, worker=worker, epoch=epoch, step=step
            )
            evidence.entries += len(entries)
            return entries

    async def step_alone(self, step: ExecutionStep) -> None:
        """Make ``step`` with no entries: for a scope that records nothing (``--unsafe-no-audit``)."""
        worker, epoch = self._membership.credentials()
        if step.reserve_binding is not None:
            raise ValueError("a step that reserves is written with its audit entries")
        if step.target is ExecutionState.INVOKING:
            await self._store.mark_invoking(step.agent, step.execution_id, worker=worker, epoch=epoch)
        else:
            await self._store.record_outcome(
                step.agent, step.execution_id, step.target, worker=worker, epoch=epoch
            )

    def end_call(self, evidence: EvidenceSession, call_id: str) -> None:
        """The call wrote its last entry (or never will): the slots it held are free."""
        if evidence.holds.pop(call_id, None) is not None and not evidence.holds:
            evidence.holds_ended.set()

    async def _make_room(
        self, evidence: EvidenceSession, call_id: str | None, count: int, *, then: int
    ) -> None:
        """Rotate first if ``count`` entries (and ``then`` held after them) would not fit; hold them.

        Called with ``evidence.lock`` held; releases it while waiting for other calls' holds.
        """
        if evidence.closed:
            raise RuntimeError("evidence session is closed")
        held = evidence.holds.pop(call_id, None) if call_id is not None else None
        if held is not None:
            # The call's later entries go where its first ones went: their slots are held here.
            if count > held:
                raise RuntimeError(f"call {call_id} wrote more entries than it held")
            if then:
                evidence.holds[call_id] = then  # type: ignore[index]
            elif not evidence.holds:
                evidence.holds_ended.set()
            return
        while self._must_rotate(evidence, count + then):
            if evidence.holds:
                # Other calls hold slots in this chain: let them finish there, then rotate.
                ended = evidence.holds_ended
                evidence.lock.release()
                try:
                    await ended.wait()
                finally:
                    # Shielded: the caller's ``async with evidence.lock`` releases it on the way out.
                    with anyio.CancelScope(shield=True):
                        await evidence.lock.acquire()
                if evidence.closed:
                    raise RuntimeError("evidence session is closed")
                continue
            await self._rotate(evidence)
        if then and call_id is not None:
            if not evidence.holds:
                evidence.holds_ended = anyio.Event()
            evidence.holds[call_id] = then

    def _must_rotate(self, evidence: EvidenceSession, need: int) -> bool:
        if evidence.entries <= 2:
            return False  # a fresh chain: MIN_MAX_ENTRIES guarantees one call fits
        held = sum(evidence.holds.values())
        return (
            evidence.entries + held + need + 1 > self._max_entries
            or self._monotonic() - evidence.opened_at >= self._max_age_s
        )

    async def _rotate(self, evidence: EvidenceSession) -> None:
        previous = evidence.session_id
        await self._close_chain(evidence, CloseReason.ROTATION)
        session_id, genesis, attestation = await self._open_chain(
            evidence.agent, evidence.genesis.policy_version
        )
        evidence.session_id, evidence.genesis, evidence.attestation = session_id, genesis, attestation
        evidence.opened_at = self._monotonic()
        evidence.entries = 2
        logger.info("evidence session rotated", extra={"previous": previous, "current": session_id})


def _builder(
    session_id: str,
    agent: str,
    event: AuditEvent,
    at: datetime,
    worker: str | None,
    epoch: int | None,
    fields: dict[str, Any],
) -> Callable[[int, str], AuditEntry]:
    def build(seq: int, prev: str) -> AuditEntry:
        return _entry(seq, prev, session_id, agent, event, at, worker=worker, epoch=epoch, **fields)

    return build


def _entry(
    seq: int,
    prev: str,
    session_id: str,
    agent: str,
    event: AuditEvent,
    at: datetime,
    *,
    worker: str | None,
    epoch: int | None,
    **fields: Any,
) -> AuditEntry:
    return link_entry(seq, prev, session_id, agent, event=event, at=at, worker=worker, epoch=epoch, **fields)
