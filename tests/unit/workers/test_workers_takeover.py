"""Peer takeover (DESIGN sections 3 and 6): only a non-live holder is superseded, with a higher epoch.

A real SQLite store, an injected clock: time moves by assignment, never by
waiting. Concurrency between two survivors is coordinated with events.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from workers_support import HOST, LEASE_S, T0, Clock

from bastion.admission.states import ExecutionState
from bastion.errors import NotDurable, StaleEpoch
from bastion.ids import AgentId, CallId, Epoch, ExecutionId, WorkerId
from bastion.store.base import Store
from bastion.store.sqlite import SqliteStore
from bastion.workers.liveness import Liveness, pid_alive
from bastion.workers.membership import WorkerMembership
from bastion.workers.registry import WorkerRole, register_identity
from bastion.workers.takeover import Takeover, scan_peers, watch_peers

pytestmark = pytest.mark.anyio

AGENT = AgentId("agent-1")
EID = ExecutionId("exec-1")
BINDING = hashlib.sha256(b"takeover").hexdigest()


async def gateway_holding(
    store: Store, generation: str, *, now: Any, pid: int | None = None
) -> tuple[WorkerId, Epoch]:
    provenance = {"pid": os.getpid() if pid is None else pid, "host": HOST, "started_by": "pytest"}
    record = await register_identity(store, "gateway", WorkerRole.GATEWAY, provenance, now=now)
    epoch = await store.claim_generation(generation, record.worker_id, now=now, lease_s=LEASE_S)
    return record.worker_id, epoch


async def leave_invoking(store: Store, worker: WorkerId, epoch: Epoch) -> None:
    await store.reserve_execution(AGENT, EID, BINDING, call_id=CallId("c-1"), worker=worker, epoch=epoch)
    await store.mark_invoking(AGENT, EID, worker=worker, epoch=epoch)


class Recoveries:
    """A ``recover`` that settles the generation's executions under the membership it is given."""

    def __init__(self, store: Store, *, fail: bool = False) -> None:
        self.store = store
        self.fail = fail
        self.seen: list[tuple[str, WorkerId, Epoch]] = []
        self.done = anyio.Event()

    async def __call__(self, membership: WorkerMembership) -> None:
        worker, epoch = membership.credentials()
        self.seen.append((membership.generation, worker, epoch))
        if self.fail:
            raise NotDurable("injected: recovery could not be made durable")
        await self.store.recover_worker(membership.generation, new_worker=worker, new_epoch=epoch)
        self.done.set()


def factory(store: Store, clock: Clock) -> Callable[[str], WorkerMembership]:
    return lambda generation: WorkerMembership(
        store, generation, lease_s=LEASE_S, heartbeat_s=1.0, clock=clock
    )


def scan(
    store: Store, clock: Clock, recover: Callable[[WorkerMembership], Awaitable[object]], *, own: str = "g2"
) -> Awaitable[list[Takeover]]:
    return scan_peers(
        store,
        factory(store, clock),
        recover,
        own_generation=own,
        lease_s=LEASE_S,
        clock=clock,
        pid_alive=pid_alive,
        this_host=HOST,
    )


async def test_a_live_holder_is_never_taken_over(store: SqliteStore, clock: Clock) -> None:
    """Inside its lease the holder keeps its generation, unsettled work or not; nothing is registered."""
    holder, epoch = await gateway_holding(store, "g1", now=T0)
    await leave_invoking(store, holder, epoch)
    recover = Recoveries(store)
    clock.advance(LEASE_S - 0.001)
    assert await scan(store, clock, recover) == []
    generation = await store.get_generation("g1")
    assert generation is not None and (generation.holder, generation.epoch) == (holder, 1)
    assert recover.seen == [] and [w.worker_id for w in await store.list_workers()] == [holder]


async def test_a_non_live_holder_is_superseded_with_a_higher_epoch_and_fenced(
    store: SqliteStore, clock: Clock
) -> None:
    """Past its lease: a fresh recovery worker claims epoch 2 and recovers; the old holder writes nothing."""
    holder, epoch = await gateway_holding(store, "g1", now=T0)
    await leave_invoking(store, holder, epoch)
    recover = Recoveries(store)
    clock.advance(LEASE_S)

    [takeover] = await scan(store, clock, recover)

    assert (takeover.generation, takeover.previous_holder, takeover.previous_epoch) == ("g1", holder, 1)
    assert takeover.epoch == 2 and takeover.why is Liveness.EXPIRED and takeover.recovered
    assert takeover.worker not in (holder,) and takeover.worker.startswith("recovery-")
    assert recover.seen == [("g1", takeover.worker, 2)]
    recovery = await store.get_worker(takeover.worker)
    assert recovery is not None and recovery.role == "recovery"
    assert recovery.provenance["supersedes"] == holder and recovery.provenance["by_generation"] == "g2"
    row = await store.get_execution(AGENT, EID)
    assert row is not None and (row.state, row.worker, row.epoch) == ("outcome_unknown", takeover.worker, 2)
    # The superseded holder's late terminal write and heartbeat are refused; the row is unchanged.
    with pytest.raises(StaleEpoch):
        await store.record_outcome(AGENT, EID, ExecutionState.COMPLETED, worker=holder, epoch=epoch)
    with pytest.raises(StaleEpoch):
        await store.heartbeat(holder, clock.now)
    assert (await store.get_execution(AGENT, EID)) == row
    # Settled: later scans leave the generation alone, even once the recovery worker's lease ran out.
    assert await scan(store, clock, recover) == []
    clock.advance(LEASE_S * 3)
    assert await scan(store, clock, recover) == []
    generation = await store.get_generation("g1")
    assert generation is not None and generation.epoch == 2


async def test_a_generation_with_nothing_unsettled_is_left_alone(store: SqliteStore, clock: Clock) -> None:
    """A non-live holder that left no executions in flight and no open chain costs no epoch."""
    await gateway_holding(store, "g1", now=T0)
    clock.advance(LEASE_S * 2)
    assert await scan(store, clock, Recoveries(store)) == []
    generation = await store.get_generation("g1")
    assert generation is not None and generation.epoch == 1


async def test_the_watcher_never_takes_its_own_generation(store: SqliteStore, clock: Clock) -> None:
    """Even with its own heartbeat late and work in flight, a gateway does not supersede itself."""
    holder, epoch = await gateway_holding(store, "g1", now=T0)
    await leave_invoking(store, holder, epoch)
    clock.advance(LEASE_S * 2)
    assert await scan(store, clock, Recoveries(store), own="g1") == []


async def test_upstream_runtime_slots_are_not_watched(store: SqliteStore, clock: Clock) -> None:
    """A launched runtime's slot belongs to its gateway: a survivor never takes it over."""
    provenance = {"pid": os.getpid(), "host": HOST, "started_by": "bastion"}
    runtime = await register_identity(store, "upstream-notes", WorkerRole.UPSTREAM, provenance, now=T0)
    await store.claim_generation("upstream:notes", runtime.worker_id, now=T0, lease_s=LEASE_S)
    await store.reserve_execution(  # not something a runtime does; proves the role alone decides
        AGENT, EID, BINDING, call_id=CallId("c"), worker=runtime.worker_id, epoch=Epoch(1)
    )
    clock.advance(LEASE_S * 2)
    assert await scan(store, clock, Recoveries(store)) == []


async def test_a_dead_pid_is_withdrawn_and_taken_over_without_waiting(
    store: SqliteStore, clock: Clock, dead_pid: int
) -> None:
    """A holder whose PID is dead on this host is withdrawn and superseded inside its lease."""
    holder, epoch = await gateway_holding(store, "g1", now=T0, pid=dead_pid)
    await leave_invoking(store, holder, epoch)
    clock.advance(1)

    [takeover] = await scan(store, clock, Recoveries(store))

    assert takeover.why is Liveness.PID_DEAD and takeover.epoch == 2
    withdrawn = await store.get_worker(holder)
    assert withdrawn is not None and withdrawn.withdrawn_at == clock.now
    assert withdrawn.withdraw_reason == f"pid {dead_pid} is dead on {HOST}"


class ClaimBarrier:
    """Proxies a store; holds every claim until ``go`` is set, so two survivors race for one claim."""

    def __init__(self, inner: Store, arrived: anyio.Event, go: anyio.Event) -> None:
        self._inner, self._arrived, self._go = inner, arrived, go

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def claim_generation(self, *args: Any, **kwargs: Any) -> Epoch:
        self._arrived.set()
        await self._go.wait()
        return await self._inner.claim_generation(*args, **kwargs)


async def test_of_two_survivors_racing_one_claim_the_second_is_refused(
    store: SqliteStore, clock: Clock, tmp_path: Any
) -> None:
    """Both see a non-live holder and try: one claims epoch 2; the other is refused and marked failed."""
    holder, epoch = await gateway_holding(store, "g1", now=T0)
    await leave_invoking(store, holder, epoch)
    clock.advance(LEASE_S)
    go = anyio.Event()
    arrivals = [anyio.Event(), anyio.Event()]
    results: list[list[Takeover]] = []
    async with await SqliteStore.open(tmp_path / "bastion.db") as replica:
        survivors = [ClaimBarrier(store, arrivals[0], go), ClaimBarrier(replica, arrivals[1], go)]

        async def survive(n: int) -> None:
            results.append(await scan(survivors[n], clock, Recoveries(store), own=f"g{n + 2}"))  # type: ignore[arg-type]

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(survive, 0)
                tg.start_soon(survive, 1)
                for arrived in arrivals:
                    await arrived.wait()
                go.set()

    takeovers = [t for found in results for t in found]
    assert len(takeovers) == 1 and takeovers[0].epoch == 2
    generation = await store.get_generation("g1")
    assert generation is not None and (generation.holder, generation.epoch) == (takeovers[0].worker, 2)
    losers = [
        w for w in await store.list_workers() if w.role == "recovery" and w.worker_id != takeovers[0].worker
    ]
    assert len(losers) == 1 and losers[0].generation is None
    assert losers[0].failure_reason == "takeover claim refused: the generation is held"


async def test_a_failed_recovery_is_taken_over_again_later(store: SqliteStore, clock: Clock) -> None:
    """A recovery that could not be made durable leaves the backlog; after the lease a takeover retries."""
    holder, epoch = await gateway_holding(store, "g1", now=T0)
    await leave_invoking(store, holder, epoch)
    clock.advance(LEASE_S)
    [first] = await scan(store, clock, Recoveries(store, fail=True))
    assert not first.recovered and first.epoch == 2
    assert await scan(store, clock, Recoveries(store)) == []  # its recovery worker is still live
    clock.advance(LEASE_S)
    [second] = await scan(store, clock, Recoveries(store))
    assert second.recovered and second.epoch == 3 and second.previous_holder == first.worker
    row = await store.get_execution(AGENT, EID)
    assert row is not None and (row.state, row.epoch) == ("outcome_unknown", 3)


async def test_watch_peers_scans_until_cancelled(store: SqliteStore, clock: Clock) -> None:
    """The watcher loop takes a non-live peer over on its own; it runs until its task is cancelled."""
    holder, epoch = await gateway_holding(store, "g1", now=T0)
    await leave_invoking(store, holder, epoch)
    clock.advance(LEASE_S)
    recover = Recoveries(store)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: watch_peers(
                    store,
                    factory(store, clock),
                    recover,
                    interval_s=0.01,
                    lease_s=LEASE_S,
                    clock=clock,
                    pid_alive=pid_alive,
                    own_generation="g2",
                    this_host=HOST,
                )
            )
            await recover.done.wait()
            tg.cancel_scope.cancel()
    assert [(g, e) for g, _, e in recover.seen] == [("g1", 2)]


async def test_watch_peers_refuses_a_non_positive_interval(store: SqliteStore, clock: Clock) -> None:
    """A zero interval would spin: refused before the first scan."""
    with pytest.raises(ValueError):
        await watch_peers(
            store,
            factory(store, clock),
            Recoveries(store),
            interval_s=0,
            lease_s=LEASE_S,
            clock=clock,
            pid_alive=pid_alive,
            own_generation="g2",
        )
