"""Evidence sessions at run time: open, append, rotate, close with a TRACE claim (DESIGN sections 1 and 4).

An :class:`EvidenceSession` is one audit chain scoped to a session-era
transport session, or shared by the sessionless requests of one agent session
(or agent) at this gateway (``audit/shared.py``). Opening writes the genesis
entry (seq 0, committing to the signing key id, the session, the agent and a
nonce) and the attestation entry (seq 1: the chain root bound into TEE
``report_data`` where configfs-tsm exists, else ``kind: none`` with the
reason). Appends go through the store, which reads the head and writes the
next link in one transaction, so concurrent calls never fork a chain: the
recorder reserves room under the session's lock, then writes outside it, so
concurrent calls' appends share the store's group commit; a close waits for
the writes in flight.
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
then issues and stores the signed claim. :meth:`EvidenceRecorder.retire`
closes the chain but leaves the handle *dormant*: its next append opens a
fresh chain behind it (a shared chain that went idle past its age bound).

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

__all__ = ["EVENT_AT", "MIN_MAX_ENTRIES", "Attestor", "EvidenceRecorder", "EvidenceSession"]

#: The key of a batch entry's fields that carries the time of its event (a ``datetime``), when it
#: was queued before its write (``call.py``): the entry's ``ts`` is that time (DESIGN section 4).
#: Without it an entry is stamped when its write is reserved.
EVENT_AT = "at"

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
    # fast_acquire: an uncontended acquire takes no loop turn (several per call).
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))
    # Slots held in this chain by calls that wrote their first entries here (call_id -> count).
    holds: dict[str, int] = field(default_factory=dict)
    # Appends reserved under the lock and being written outside it.
    writing: int = 0
    # Set when a hold ends or a write finishes: wakes whoever waits for the chain to be quiet.
    settled: anyio.Event = field(default_factory=anyio.Event)
    # Retired (its chain closed with a claim): the next append opens a fresh chain behind it.
    dormant: bool = False

    @property
    def quiet(self) -> bool:
        """No call holds slots in the chain and no append is being written to it."""
        return not self.holds and self.writing == 0


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
        observe_write: Callable[[float], None] | None = None,
    ) -> None:
        # Seconds each durable append took (the store's group commit included): metrics.py.
        self._observe_write = observe_write
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
            await self._wait_for(evidence, lambda: evidence.writing == 0)
            if evidence.closed:
                return evidence.claim
            if evidence.dormant:
                evidence.closed = True  # its last chain was closed (and claimed) when it retired
                return evidence.claim
            evidence.claim = await self._close_chain(evidence, reason)
            evidence.closed = True
            return evidence.claim

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
        then: int = 0,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        """Append several entries in order (rotating first if due), durably, in one store write.

        With ``step``, that execution transition is written in the same transaction as the
        entries (``store/base.py`` :class:`ExecutionStep`).

        ``then`` is how many more entries the batch's call may write to this chain: they are
        held for it (see the module docstring) until it writes them or :meth:`end_call`.
        """
        async with evidence.lock:
            if evidence.closed:
                raise RuntimeError("evidence session is closed")
            call_id = batch[0][1].get("call_id") if batch else None
            await self._make_room(evidence, call_id, len(batch), then=then)
            worker, epoch = self._membership.credentials()
            at = self._now()
            session_id = evidence.session_id
            builders = [
                _builder(session_id, evidence.agent, event, at, worker, epoch, fields)
                for event, fields in batch
            ]
            # Reserved now; written outside the lock, so concurrent calls share one group commit.
            # The store links each append to the head it reads in its transaction: no fork, no gap.
            evidence.entries += len(batch)
            evidence.writing += 1
        started = time.perf_counter()
        try:
            entries = await self._store.append_entries(
                session_id, builders, worker=worker, epoch=epoch, step=step
            )
            if self._observe_write is not None:
                self._observe_write(time.perf_counter() - started)
            return entries
        except BaseException:
            evidence.entries -= len(batch)
            raise
        finally:
            evidence.writing -= 1
            _settle(evidence)

    async def step_alone(self, step: ExecutionStep) -> None:
        """Make ``step`` with no entries: for a scope that records nothing (``--unsafe-no-audit``)."""
        worker, epoch = self._membership.credentials()
        if step.reserve_binding is not None:
            # No entries to keep the two together: reserve (same refusals), then mark.
            assert step.call_id is not None
            await self._store.reserve_execution(
                step.agent,
                step.execution_id,
                step.reserve_binding,
                call_id=step.call_id,
                worker=worker,
                epoch=epoch,
            )
        if step.target is ExecutionState.INVOKING:
            await self._store.mark_invoking(step.agent, step.execution_id, worker=worker, epoch=epoch)
        else:
            await self._store.record_outcome(
                step.agent, step.execution_id, step.target, worker=worker, epoch=epoch
            )

    def end_call(self, evidence: EvidenceSession, call_id: str) -> None:
        """The call wrote its last entry (or never will): the slots it held are free."""
        if evidence.holds.pop(call_id, None) is not None:
            _settle(evidence)

    async def retire(
        self, evidence: EvidenceSession, reason: CloseReason, *, wait_s: float | None
    ) -> str | None:
        """Close the chain with its claim, leaving the handle dormant (its next append reopens).

        ``wait_s=None``: only if no call holds slots in it (a call's entries stay in one chain);
        else ``None`` is returned and nothing changes. A number: wait up to that long for the
        holders to finish, then close anyway (shutdown, revocation), and a late entry opens a new
        chain. Writes in flight always finish first. Returns the id of the chain closed, or
        ``None``. Raises ``StoreError``.
        """
        async with evidence.lock:
            if evidence.closed or evidence.dormant:
                return None
            if wait_s is not None:
                with anyio.move_on_after(wait_s):
                    await self._wait_for(evidence, lambda: evidence.quiet)
            await self._wait_for(evidence, lambda: evidence.writing == 0)
            if evidence.closed or evidence.dormant or (wait_s is None and evidence.holds):
                return None
            evidence.claim = await self._close_chain(evidence, reason)
            evidence.dormant = True
            evidence.holds.clear()
            return evidence.session_id

    async def _wait_for(self, evidence: EvidenceSession, ready: Callable[[], bool]) -> None:
        """Wait, with ``evidence.lock`` released, until ``ready()`` (re-checked under the lock)."""
        while not ready():
            if evidence.settled.is_set():
                evidence.settled = anyio.Event()
            settled = evidence.settled
            evidence.lock.release()
            try:
                await settled.wait()
            finally:
                # Shielded: the caller's ``async with evidence.lock`` releases it on the way out.
                with anyio.CancelScope(shield=True):
                    await evidence.lock.acquire()

    async def _make_room(
        self, evidence: EvidenceSession, call_id: str | None, count: int, *, then: int
    ) -> None:
        """Rotate first if ``count`` entries (and ``then`` held after them) would not fit; hold them.

        Called with ``evidence.lock`` held; releases it while waiting for other calls' holds
        and writes.
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
            else:
                _settle(evidence)
            return
        if evidence.dormant:
            await self._reopen(evidence)
        while self._must_rotate(evidence, count + then):
            if not evidence.quiet:
                # Other calls hold slots in (or are writing to) this chain: let them finish there.
                await self._wait_for(evidence, lambda: evidence.quiet)
                if evidence.closed:
                    raise RuntimeError("evidence session is closed")
                if evidence.dormant:
                    await self._reopen(evidence)
                continue
            await self._rotate(evidence)
        if then and call_id is not None:
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
        await self._reopen(evidence)
        logger.info("evidence session rotated", extra={"previous": previous, "current": evidence.session_id})

    async def _reopen(self, evidence: EvidenceSession) -> None:
        session_id, genesis, attestation = await self._open_chain(
            evidence.agent, evidence.genesis.policy_version
        )
        evidence.session_id, evidence.genesis, evidence.attestation = session_id, genesis, attestation
        evidence.opened_at = self._monotonic()
        evidence.entries = 2
        evidence.dormant = False
        evidence.claim = None


def _settle(evidence: EvidenceSession) -> None:
    """A hold ended or a write finished: wake whoever waits for the chain to be quiet."""
    evidence.settled.set()


def _builder(
    session_id: str,
    agent: str,
    event: AuditEvent,
    at: datetime,
    worker: str | None,
    epoch: int | None,
    fields: dict[str, Any],
) -> Callable[[int, str], AuditEntry]:
    if EVENT_AT in fields:
        at = fields[EVENT_AT]
        fields = {k: v for k, v in fields.items() if k != EVENT_AT}

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
