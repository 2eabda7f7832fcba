"""The worker registry: registering identities, and what each worker is now (DESIGN section 6, seed 004).

Owns the two answers the seed keeps apart:

- **launch provenance** (who started a worker, how, from which configuration),
  answered from what :meth:`Store.register_worker` recorded at launch;
- **session ownership** (which live client transport sessions use it now),
  answered only from live attachment records. A record counts only while its
  writer still holds its claim at the epoch it wrote under and both workers
  are live; with none, ownership reads ``unproven``, never a guess.

Also cohorts: workers sharing a role (or a launched server) form a cohort, and
distinct identities in one cohort are fine. A worker with no identity
evidence (an identity not minted by ``workers/identity.py``, or a provenance
without ``pid``, ``host`` and ``started_by``) is classified a duplicate, and
:func:`register_identity` refuses to register one.

This module reads the store and writes only registrations; it never decides a
takeover (``workers/takeover.py``) and never prints (``cli/workers_cmd.py``).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bastion.errors import Conflict
from bastion.ids import Epoch, WorkerId
from bastion.propagation.policy_status import fleet_policy
from bastion.store.base import AttachmentRecord, GenerationRecord, Store, WorkerRecord
from bastion.workers.identity import WORKER_ID_RULE, mint_worker_id
from bastion.workers.liveness import Liveness, PidAlive, liveness_of

__all__ = [
    "IDENTITY_EVIDENCE",
    "UNPROVEN",
    "CohortStanding",
    "WorkerRole",
    "WorkerView",
    "cohort_of",
    "describe_workers",
    "missing_identity_evidence",
    "proven_owners",
    "register_identity",
]

UNPROVEN = "unproven"
"""What an answer reads when no record proves it (DESIGN section 6): never a guess."""

IDENTITY_EVIDENCE = ("pid", "host", "started_by")
"""Provenance keys every registration must carry: without them a process is a duplicate."""

_REGISTER_ATTEMPTS = 5


class WorkerRole(enum.StrEnum):
    GATEWAY = "gateway"  # a gateway replica (workers/membership.py)
    RECOVERY = "recovery"  # a survivor's stand-in that took a dead replica's generation over
    UPSTREAM = "upstream"  # an upstream runtime Bastion launched (workers/runtimes.py)


class CohortStanding(enum.StrEnum):
    MEMBER = "member"  # a distinct identity in its cohort
    DUPLICATE = "duplicate"  # no identity evidence: indistinguishable from a duplicate


def missing_identity_evidence(worker_id: str, provenance: Mapping[str, Any]) -> tuple[str, ...]:
    """What identity evidence ``worker_id`` and ``provenance`` lack (empty when they have it all)."""
    missing = [key for key in IDENTITY_EVIDENCE if provenance.get(key) in (None, "")]
    if not WORKER_ID_RULE.match(worker_id):
        missing.insert(0, "minted identity")
    return tuple(missing)


def cohort_of(record: WorkerRecord) -> str:
    """The cohort a worker belongs to: its provenance's ``cohort`` (launched servers), else its role."""
    cohort = record.provenance.get("cohort")
    return cohort if isinstance(cohort, str) and cohort else record.role


async def register_identity(
    store: Store, name: str, role: WorkerRole, provenance: Mapping[str, Any], *, now: datetime
) -> WorkerRecord:
    """Register a freshly minted identity ``<name>-<UTC timestamp>-<short sha>`` and return its record.

    An identity that exists is never adopted: another is minted (a few times).
    Raises :class:`Conflict` when ``provenance`` lacks identity evidence (the
    process would be a duplicate) or no fresh identity could be registered,
    and what :meth:`Store.register_worker` raises.
    """
    missing = [key for key in IDENTITY_EVIDENCE if provenance.get(key) in (None, "")]
    if missing:
        raise Conflict("no identity evidence: registration refused as a duplicate", missing=missing)
    for _ in range(_REGISTER_ATTEMPTS):
        candidate = mint_worker_id(name, now=now)
        try:
            return await store.register_worker(candidate, role.value, provenance, now=now)
        except Conflict:
            continue  # never replaced, adopted or merged: mint another
    raise Conflict("could not register a fresh worker identity", name=name)


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as ``bastion workers`` and ``GET /admin/workers`` show it."""

    worker_id: WorkerId
    role: str
    generation: str | None
    epoch: Epoch | None
    holds_generation: bool
    liveness: Liveness
    registered_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    provenance: Mapping[str, Any]
    owning_sessions: tuple[str, ...] | None  # None: unproven
    cohort: str
    cohort_live: int
    standing: CohortStanding
    missing_evidence: tuple[str, ...]
    withdraw_reason: str | None
    failure_reason: str | None
    # Gateways only (#10): the policy snapshot it reported, and whether it is behind the fleet's newest.
    policy_version: str | None = None
    policy_behind: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "role": self.role,
            "generation": self.generation,
            "epoch": self.epoch,
            "holds_generation": self.holds_generation,
            "superseded": self.generation is not None and not self.holds_generation,
            "liveness": self.liveness.value,
            "registered_at": _iso(self.registered_at),
            "heartbeat_at": _iso(self.heartbeat_at),
            "heartbeat_age_s": round(self.heartbeat_age_s, 3),
            "provenance": dict(self.provenance),
            "owning_sessions": UNPROVEN if self.owning_sessions is None else list(self.owning_sessions),
            "cohort": self.cohort,
            "cohort_live": self.cohort_live,
            "cohort_standing": self.standing.value,
            "missing_identity_evidence": list(self.missing_evidence),
            "withdraw_reason": self.withdraw_reason,
            "failure_reason": self.failure_reason,
            "policy_version": self.policy_version,
            "policy_behind": self.policy_behind,
        }


def proven_owners(
    worker: WorkerRecord,
    attachments: Sequence[AttachmentRecord],
    *,
    live: Mapping[WorkerId, bool],
    holders: Mapping[str, GenerationRecord],
    generation_of: Mapping[WorkerId, str | None],
) -> tuple[str, ...] | None:
    """The transport sessions that live attachment records prove use ``worker`` now; ``None`` if none.

    A record proves ownership only if (1) ``worker`` is live, (2) its writer is
    live, and (3) its writer still holds its generation at the record's epoch.
    """
    if not live.get(worker.worker_id, False):
        return None
    owners: set[str] = set()
    for record in attachments:
        if record.worker_id != worker.worker_id or not live.get(record.writer, False):
            continue
        writer_generation = generation_of.get(record.writer)
        held = holders.get(writer_generation) if writer_generation is not None else None
        if held is None or held.holder != record.writer or held.epoch != record.epoch:
            continue  # written under a claim that is no longer current
        owners.add(record.transport_session_ref)
    return tuple(sorted(owners)) or None


def recorded_lease_s(record: WorkerRecord) -> float | None:
    """The lease the worker's own gateway ran with, as its provenance recorded it (``None``: not recorded)."""
    lease = record.provenance.get("lease_s")
    return float(lease) if isinstance(lease, int | float) and lease > 0 else None


async def describe_workers(
    store: Store,
    *,
    now: datetime,
    lease_s: float | None,
    pid_alive: PidAlive,
    this_host: str,
    default_lease_s: float = 10.0,
) -> list[WorkerView]:
    """Every registered worker as of ``now``, oldest first. Raises :class:`StoreError` if a read fails.

    ``lease_s`` judges every worker; ``None`` judges each with the lease its gateway recorded
    (``default_lease_s`` where none was recorded), as the gateway itself judges it.
    """
    if lease_s is not None and not lease_s > 0:
        raise ValueError("lease_s must be positive")
    workers = await store.list_workers()
    holders = {g.generation: g for g in await store.list_generations()}
    attachments = await store.list_attachments()
    verdicts = {
        w.worker_id: liveness_of(
            w,
            now,
            lease_s if lease_s is not None else (recorded_lease_s(w) or default_lease_s),
            pid_alive=pid_alive,
            this_host=this_host,
        )
        for w in workers
    }
    live = {worker_id: verdict is Liveness.LIVE for worker_id, verdict in verdicts.items()}
    generation_of = {w.worker_id: w.generation for w in workers}
    cohort_live = Counter(cohort_of(w) for w in workers if live[w.worker_id])
    policy = fleet_policy(
        await store.list_policy_reports(), [w.worker_id for w in workers if live[w.worker_id]]
    )
    views = []
    for worker in workers:
        held = holders.get(worker.generation) if worker.generation is not None else None
        missing = missing_identity_evidence(worker.worker_id, worker.provenance)
        views.append(
            WorkerView(
                worker_id=worker.worker_id,
                role=worker.role,
                generation=worker.generation,
                epoch=worker.epoch,
                holds_generation=held is not None and held.holder == worker.worker_id,
                liveness=verdicts[worker.worker_id],
                registered_at=worker.registered_at,
                heartbeat_at=worker.heartbeat_at,
                heartbeat_age_s=max(0.0, (now - worker.heartbeat_at).total_seconds()),
                provenance=worker.provenance,
                owning_sessions=proven_owners(
                    worker, attachments, live=live, holders=holders, generation_of=generation_of
                ),
                cohort=cohort_of(worker),
                cohort_live=cohort_live[cohort_of(worker)],
                standing=CohortStanding.DUPLICATE if missing else CohortStanding.MEMBER,
                missing_evidence=missing,
                withdraw_reason=worker.withdraw_reason,
                failure_reason=worker.failure_reason,
                policy_version=policy.version_of(worker.worker_id),
                policy_behind=worker.worker_id in policy.behind,
            )
        )
    return views


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
