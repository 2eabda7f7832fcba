"""A survivor takes over the generations of peers that are not live, and recovers them (DESIGN §3, §6).

Two gateway replicas on one store each hold their own generation. When one
stops (crashed, killed, paused), :func:`watch_peers` in a survivor notices,
on its next scan, that the generation's holder is not live (its heartbeat is
as old as the lease, or its PID is known dead on this host: liveness is then
withdrawn first, at once), and that the generation left work unsettled
(executions ``reserved``/``invoking``, evidence chains open). It then
registers a fresh *recovery* worker identity, claims that generation with a
strictly higher epoch, and runs ``recover`` under it (the gateway passes
``workers/recovery.recover_generation``), heartbeating the recovery worker
meanwhile so no second survivor takes the generation over mid-recovery.

Rules this module keeps:

- a live holder is never taken over (the store refuses the claim anyway);
- of two survivors, one wins the claim; the other is refused and moves on;
- a generation with nothing unsettled is left alone: taking it over would
  only burn an epoch (a restart of that replica claims it as usual);
- only gateway generations are watched: a launched upstream runtime's slot
  belongs to the gateway that launched it (``workers/runtimes.py``);
- the watcher never takes its own generation over, even if its own heartbeat
  is late.

A superseded holder that wakes up learns it at its next write or heartbeat
(:class:`StaleEpoch`) and stops serving (``workers/membership.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import anyio

from bastion.errors import Conflict, StaleEpoch, StoreError
from bastion.ids import Epoch, WorkerId
from bastion.store.base import GenerationRecord, Store, WorkerRecord
from bastion.store.failure_log import FailureLog
from bastion.workers.liveness import Liveness, PidAlive, liveness_of
from bastion.workers.liveness import this_host as local_host
from bastion.workers.membership import WorkerMembership
from bastion.workers.registry import WorkerRole, register_identity
from bastion.workers.withdrawal import withdraw_if_dead

__all__ = ["MembershipFactory", "Recover", "Takeover", "scan_peers", "watch_peers"]

logger = logging.getLogger(__name__)

MembershipFactory = Callable[[str], WorkerMembership]
"""``factory(generation)``: an unjoined :class:`WorkerMembership` for that generation."""

Recover = Callable[[WorkerMembership], Awaitable[object]]
"""``recover(membership)``: settle what the generation left, writing under ``membership.credentials()``."""

_WATCHED_ROLES = frozenset({WorkerRole.GATEWAY.value, WorkerRole.RECOVERY.value})


@dataclass(frozen=True, slots=True)
class Takeover:
    """One generation taken over: from whom, by which recovery worker, at which epoch, and why."""

    generation: str
    previous_holder: WorkerId
    previous_epoch: Epoch
    worker: WorkerId
    epoch: Epoch
    why: Liveness
    recovered: bool


async def scan_peers(
    store: Store,
    membership_factory: MembershipFactory,
    recover: Recover,
    *,
    own_generation: str,
    lease_s: float,
    clock: Callable[[], datetime],
    pid_alive: PidAlive,
    this_host: str,
) -> list[Takeover]:
    """One pass over the store's generations; returns the takeovers it made (see the module docstring).

    Raises :class:`StoreError` when a read or a registration fails; a claim
    lost to another claimant is not an error (that generation is skipped).
    """
    takeovers = []
    for claimed in await store.list_generations():
        if claimed.generation == own_generation:
            continue
        holder = await store.get_worker(claimed.holder)
        if holder is None or holder.role not in _WATCHED_ROLES:
            continue
        # (1) Never a live holder.
        verdict = liveness_of(holder, clock(), lease_s, pid_alive=pid_alive, this_host=this_host)
        if verdict is Liveness.LIVE:
            continue
        # (2) A PID known dead here: withdraw liveness first, so the record says why.
        if verdict is Liveness.PID_DEAD:
            await withdraw_if_dead(
                store, claimed.generation, this_host=this_host, pid_alive=pid_alive, now=clock()
            )
        # (3) Nothing unsettled: nothing to recover, no epoch to burn.
        if (await store.generation_backlog(claimed.generation)).empty:
            continue
        takeover = await _take_over(
            store,
            claimed,
            holder,
            verdict,
            membership_factory,
            recover,
            own_generation=own_generation,
            lease_s=lease_s,
            clock=clock,
            this_host=this_host,
        )
        if takeover is not None:
            takeovers.append(takeover)
    return takeovers


async def _take_over(
    store: Store,
    claimed: GenerationRecord,
    holder: WorkerRecord,
    verdict: Liveness,
    membership_factory: MembershipFactory,
    recover: Recover,
    *,
    own_generation: str,
    lease_s: float,
    clock: Callable[[], datetime],
    this_host: str,
) -> Takeover | None:
    # (4) A fresh identity of its own: never the dead holder's, never this gateway's.
    record = await register_identity(
        store,
        "recovery",
        WorkerRole.RECOVERY,
        {
            "started_by": "takeover",
            "pid": os.getpid(),
            "host": this_host,
            "by_generation": own_generation,
            "supersedes": holder.worker_id,
            "liveness_seen": verdict.value,
        },
        now=clock(),
    )
    worker = record.worker_id
    # (5) Claim with a strictly higher epoch; the store refuses it while the holder is live.
    try:
        epoch = await store.claim_generation(claimed.generation, worker, now=clock(), lease_s=lease_s)
    except Conflict:
        # Another survivor won, or the holder came back: this identity never held anything.
        await store.mark_worker_failed(worker, "takeover claim refused: the generation is held", clock())
        return None
    logger.warning(
        "took over a peer's generation",
        extra={
            "generation": claimed.generation,
            "previous_holder": holder.worker_id,
            "previous_epoch": claimed.epoch,
            "epoch": epoch,
            "liveness": verdict.value,
        },
    )
    membership = membership_factory(claimed.generation)
    membership.worker, membership.epoch = worker, epoch
    # (6) Recover under the new epoch, keeping the recovery worker's claim fresh meanwhile.
    recovered = False
    async with anyio.create_task_group() as tg:
        tg.start_soon(_keep_fresh, store, worker, clock, max(lease_s / 3, 0.01))
        try:
            await recover(membership)
            recovered = True
            logger.warning(
                "recovered a taken-over generation",
                extra={"generation": claimed.generation, "worker": worker, "epoch": epoch},
            )
        except StoreError as exc:
            logger.error(
                "recovery of a taken-over generation failed; a later scan retries",
                extra={"generation": claimed.generation, "error": exc.message},
            )
        finally:
            tg.cancel_scope.cancel()
    return Takeover(claimed.generation, holder.worker_id, claimed.epoch, worker, epoch, verdict, recovered)


async def _keep_fresh(
    store: Store, worker: WorkerId, clock: Callable[[], datetime], interval_s: float
) -> None:
    while True:
        await anyio.sleep(interval_s)
        try:
            await store.heartbeat(worker, clock())
        except StaleEpoch:
            return  # superseded in turn: recovery's own writes will be refused
        except StoreError as exc:
            logger.warning("recovery worker heartbeat failed: %s", exc.message)


async def watch_peers(
    store: Store,
    membership_factory: MembershipFactory,
    recover: Recover,
    *,
    interval_s: float,
    lease_s: float,
    clock: Callable[[], datetime],
    pid_alive: PidAlive,
    own_generation: str,
    this_host: str | None = None,
) -> None:
    """Scan every ``interval_s`` seconds, forever (run it in the gateway's task group).

    A failed scan is logged and retried at the next interval: recovering a
    peer must never bring the survivor down.
    """
    if not interval_s > 0 or not lease_s > 0:
        raise ValueError("interval_s and lease_s must be positive")
    host = this_host if this_host is not None else local_host()
    log = FailureLog(logger, "scanning peers for takeover")  # one line per change (#23)
    while True:
        try:
            await scan_peers(
                store,
                membership_factory,
                recover,
                own_generation=own_generation,
                lease_s=lease_s,
                clock=clock,
                pid_alive=pid_alive,
                this_host=host,
            )
        except Exception as exc:
            log.failed(exc, note=f"; retrying every {interval_s:g} s")
        else:
            log.worked()
        await anyio.sleep(interval_s)
