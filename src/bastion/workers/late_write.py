"""What a fenced writer observed, recorded where a current writer can (DESIGN section 6, issue #11 point 5).

A gateway paused past its lease is superseded: a survivor recovers its
generation (``invoking`` → ``outcome_unknown``) and every later write of the
old epoch is refused (``StaleEpoch``). That refusal is right, but the old
gateway still *observed* something the evidence would otherwise lose: the
upstream's answer (completed or failed) arrived after all.

So the fenced gateway registers a fresh identity (role ``recovery``) in a slot
of its own (``late-write:<call_id>``), claims it (a current epoch, so its
writes are not stale), and writes one evidence session for the agent: one
``refused`` entry with reason ``stale_epoch`` that names the execution, the
call, the outcome observed, and the stale worker and epoch. The session is
closed and its TRACE claim issued like any other; ``bastion audit join
--execution-id`` finds it next to the recovery entry. Nothing here touches the
execution row: its terminal state stays what recovery made it.

Never a storage failure: a stale epoch does not degrade the store.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bastion.audit.chain import CloseReason
from bastion.audit.entry import AuditEvent, Decision
from bastion.audit.recorder import EvidenceRecorder
from bastion.audit.scope import EvidenceScope
from bastion.errors import Reason, StoreError
from bastion.ids import AgentId, WorkerId
from bastion.store.base import Store
from bastion.workers.membership import WorkerMembership
from bastion.workers.registry import WorkerRole, register_identity

__all__ = ["LateWrite", "record_late_write"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LateWrite:
    """A write the store refused because its writer's epoch was stale, and what it would have said."""

    agent: AgentId
    call_id: str
    execution_id: str | None
    observed_outcome: str
    stale_worker: WorkerId
    stale_epoch: int
    generation: str
    evidence_session_id: str | None  # the (now closed) session the entry was meant for
    fields: dict[str, Any]  # server, tool, binding, args_digest, workflow_id of the call


async def record_late_write(
    store: Store,
    late: LateWrite,
    *,
    recorder_for: Callable[[WorkerMembership], EvidenceRecorder],
    policy_version: str,
    lease_s: float,
    heartbeat_s: float,
    clock: Callable[[], datetime],
) -> str:
    """Write ``late`` as an entry of a fresh evidence session under a fresh, current writer.

    Returns that evidence session's id. Raises :class:`StoreError` when storage fails.
    """
    record = await register_identity(
        store,
        "late-write",
        WorkerRole.RECOVERY,
        {
            "started_by": "late-write report",
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "supersedes": late.stale_worker,
            "stale_generation": late.generation,
            "lease_s": lease_s,
        },
        now=clock(),
    )
    membership = WorkerMembership(
        store, f"late-write:{late.call_id}", lease_s=lease_s, heartbeat_s=heartbeat_s, clock=clock
    )
    membership.worker = record.worker_id
    membership.epoch = await store.claim_generation(
        membership.generation, record.worker_id, now=clock(), lease_s=lease_s
    )
    scope = EvidenceScope(recorder_for(membership), late.agent, policy_version=policy_version)
    try:
        await scope.record(
            AuditEvent.REFUSED,
            **late.fields,
            call_id=late.call_id,
            execution_id=late.execution_id,
            decision=Decision.DENY.value,
            reason=Reason.STALE_EPOCH.value,
            outcome=late.observed_outcome,
            detail={
                "late_write": "the terminal write of a superseded worker was refused",
                "stale_worker": late.stale_worker,
                "stale_epoch": late.stale_epoch,
                "stale_generation": late.generation,
                "meant_for_evidence_session": late.evidence_session_id,
            },
        )
        await scope.close(CloseReason.REQUEST_END)
    finally:
        # Its one job is done: it is not a live worker from now on.
        try:
            await store.withdraw_liveness(record.worker_id, now=clock(), reason="late-write report written")
        except StoreError as exc:
            logger.warning("late-write reporter not withdrawn: %s", exc.message)
    assert scope.session_id is not None
    logger.warning(
        "late write refused (superseded); what it observed is recorded",
        extra={
            "execution_id": late.execution_id,
            "observed_outcome": late.observed_outcome,
            "stale_worker": late.stale_worker,
            "evidence_session_id": scope.session_id,
        },
    )
    return scope.session_id
