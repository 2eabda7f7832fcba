"""Recovering what a dead predecessor of this worker's generation left (DESIGN sections 3 and 6).

Runs once, after a takeover claim succeeded with a higher epoch and before the
gateway serves: executions left ``invoking`` become ``outcome_unknown`` and
those left ``reserved`` become ``released`` (in one store transaction, under
the new epoch), each with an audit entry whose ``ts`` is when recovery wrote it
and whose ``detail.last_entry`` names the dead worker's last entry of that call
(session, seq, hash and ``ts``, the last time the call was known of; ``null``
when it left none). An execution left ``invoking`` whose task is still live in
the store is not closed: its fate is its task's (the next poll at any replica
settles it, or finds the task lost: ``tasks/relay.py``), so recovery leaves it
``invoking`` under the new epoch and writes a ``recovery`` entry, reason
``task_live``, with no outcome and ``detail.task_id`` (DESIGN section 3: a
terminal state only for what nobody can learn any more). Then every evidence session the
generation left open is closed with reason ``recovery`` and its claim issued.
Before that, a call without an execution id whose last entry in such a chain is
``admitted`` (a tool that may act writes it before the send, ``call.py``) was
at the upstream when its worker died: recovery writes its ``outcome_unknown``
entry, reason ``recovery``, naming that last entry the same way.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime

from bastion.audit.chain import ATTESTATION_SEQ, ChainSummary, CloseReason, attestation_entry, close_entry
from bastion.audit.claim import ClaimProfile, PolicyInForce, issue_claim
from bastion.audit.earlier import last_entry_of_call
from bastion.audit.entry import AuditEntry, AuditEvent
from bastion.audit.recorder import EvidenceRecorder
from bastion.audit.scope import EvidenceScope
from bastion.audit.tee import no_attestation
from bastion.crypto.keys import Keyring
from bastion.errors import Conflict
from bastion.ids import AgentId
from bastion.store.base import ChainInfo, RecoveredExecution, Store
from bastion.workers.membership import WorkerMembership

__all__ = ["recover_generation"]

logger = logging.getLogger(__name__)


async def recover_generation(
    store: Store,
    recorder: EvidenceRecorder,
    membership: WorkerMembership,
    keyring: Keyring,
    *,
    profile: ClaimProfile,
    policy: PolicyInForce,
) -> tuple[list[RecoveredExecution], list[str]]:
    """Settle the generation's executions and close its open chains; returns what changed."""
    worker, epoch = membership.credentials()
    left_open = await store.list_open_chains(generation=membership.generation)
    changes = await store.recover_worker(membership.generation, new_worker=worker, new_epoch=epoch)
    by_agent: dict[str, list[RecoveredExecution]] = defaultdict(list)
    for change in changes:
        by_agent[change.agent].append(change)
    for agent, rows in by_agent.items():
        scope = EvidenceScope(recorder, rows[0].agent, policy_version=None)
        for row in rows:
            detail = {
                "previous_state": row.previous_state.value,
                "previous_worker": row.previous_worker,
                "previous_epoch": row.previous_epoch,
                # The dead worker's last entry of this call (its ts: the event's last known time).
                "last_entry": await last_entry_of_call(store, row.agent, row.execution_id, row.call_id),
            }
            if row.task_id is not None:
                # Left to its live task: no outcome (the row stays invoking), the task it waits on.
                await scope.record(
                    AuditEvent.RECOVERY,
                    call_id=row.call_id,
                    execution_id=row.execution_id,
                    binding=row.binding,
                    reason="task_live",
                    detail={**detail, "task_id": row.task_id},
                )
                continue
            await scope.record(
                AuditEvent(row.state.value),
                call_id=row.call_id,
                execution_id=row.execution_id,
                binding=row.binding,
                outcome=row.state.value,
                reason="recovery",
                detail=detail,
            )
        await scope.close(CloseReason.RECOVERY)
        logger.warning("recovered executions", extra={"agent": agent, "count": len(rows)})
    await _settle_calls_left_open(store, recorder, left_open)
    closed = [
        await _close_left_open(store, chain, membership, keyring, profile, policy) for chain in left_open
    ]
    return changes, [c for c in closed if c]


#: The events after which a call without an execution id may still be at its upstream.
_UNSETTLED = frozenset({AuditEvent.ADMITTED.value, AuditEvent.INVOKING.value})


async def _settle_calls_left_open(
    store: Store, recorder: EvidenceRecorder, left_open: list[ChainInfo]
) -> None:
    """An ``outcome_unknown`` entry for each call without an execution id that a chain left open
    shows admitted and never settled (one with an execution id is settled by its row above)."""
    by_agent: dict[str, list[AuditEntry]] = defaultdict(list)
    for chain in left_open:
        last_of_call: dict[str, AuditEntry] = {}
        for entry in await store.read_chain(chain.session_id):
            if entry.call_id is not None:
                last_of_call[entry.call_id] = entry
        for last in last_of_call.values():
            if last.execution_id is None and last.event in _UNSETTLED and last.agent is not None:
                by_agent[last.agent].append(last)
    for agent, calls in by_agent.items():
        scope = EvidenceScope(recorder, AgentId(agent), policy_version=None)
        for last in calls:
            await scope.record(
                AuditEvent.OUTCOME_UNKNOWN,
                call_id=last.call_id,
                workflow_id=last.workflow_id,
                server=last.server,
                tool=last.tool,
                args_digest=last.args_digest,
                binding=last.binding,
                policy_version=last.policy_version,
                outcome=AuditEvent.OUTCOME_UNKNOWN.value,
                reason="recovery",
                detail={
                    "previous_state": last.event,
                    "previous_worker": last.worker,
                    "previous_epoch": last.epoch,
                    "last_entry": {
                        "session_id": last.session_id,
                        "seq": last.seq,
                        "hash": last.hash,
                        "ts": last.ts,
                    },
                },
            )
        await scope.close(CloseReason.RECOVERY)
        logger.warning("recovered calls left at the upstream", extra={"agent": agent, "count": len(calls)})


async def _close_left_open(
    store: Store,
    chain: ChainInfo,
    membership: WorkerMembership,
    keyring: Keyring,
    profile: ClaimProfile,
    policy: PolicyInForce,
) -> str | None:
    worker, epoch = membership.credentials()
    now = datetime.now(UTC)
    entries = await store.read_chain(chain.session_id, limit=ATTESTATION_SEQ + 1)
    genesis = entries[0]
    attestation: AuditEntry | None = entries[1] if len(entries) > ATTESTATION_SEQ else None
    try:
        if attestation is None:
            # Died between opening and binding: say so, plainly, in the attestation slot.
            record = no_attestation("the worker that opened this session died before binding its root")
            attestation = attestation_entry(genesis, record, at=now, worker=worker, epoch=epoch)
            bound = attestation
            await store.append_entry(chain.session_id, lambda seq, prev: bound, worker=worker, epoch=epoch)
        built: list[AuditEntry] = []

        def final(seq: int, prev: str) -> AuditEntry:
            head = _head_stub(genesis, seq - 1, prev)
            entry = close_entry(head, CloseReason.RECOVERY, at=now, worker=worker, epoch=epoch)
            built.append(entry)
            return entry

        await store.close_chain(chain.session_id, worker=worker, epoch=epoch, final=final)
        summary = ChainSummary.of(genesis, attestation, built[-1])
        claim = issue_claim(summary, profile=profile, policy=policy, keyring=keyring, issued_at=now)
        await store.store_claim(chain.session_id, claim, worker=worker, epoch=epoch)
    except (Conflict, ValueError) as exc:
        logger.error(
            "could not close a chain left open", extra={"session_id": chain.session_id, "error": str(exc)}
        )
        return None
    return chain.session_id


def _head_stub(genesis: AuditEntry, seq: int, head_hash: str) -> AuditEntry:
    """A stand-in for the chain's head, enough for ``close_entry`` (it reads seq, hash, session, agent)."""
    from dataclasses import replace

    return replace(genesis, seq=seq, hash=head_hash, event=AuditEvent.ADMITTED.value)
