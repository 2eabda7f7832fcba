"""Launched upstream runtimes (DESIGN section 6): one identity per process, failures scoped to it.

A real SQLite store and an injected clock; events from the process hook are
observed through a store wrapper that signals each write, never by waiting.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from workers_support import HOST, LEASE_S, T0, Clock

from bastion.errors import NotDurable, StaleEpoch
from bastion.ids import WorkerId
from bastion.store.base import Store
from bastion.store.sqlite import SqliteStore
from bastion.workers.liveness import pid_alive
from bastion.workers.registry import WorkerRole, register_identity
from bastion.workers.runtimes import RuntimeRegistry

pytestmark = pytest.mark.anyio


def registry(store: Store, clock: Clock, *, owner: str | None = None) -> RuntimeRegistry:
    return RuntimeRegistry(
        store,
        clock=clock,
        lease_s=LEASE_S,
        heartbeat_s=LEASE_S / 3,
        owner=owner,
        launched_by=WorkerId("gateway-20260501T120000Z-0123456789ab"),
        host=HOST,
        pid_alive=pid_alive,
    )


async def test_a_replacement_gets_a_new_identity_and_a_higher_epoch(store: SqliteStore, clock: Clock) -> None:
    """The crashed process is failed by its identity; its replacement registers anew and claims epoch 2."""
    runtimes = registry(store, clock)
    first, first_epoch = await runtimes.register_launch("notes", 101, "cfg-1")
    assert first_epoch == 1 and first.startswith("upstream-notes-")
    record = await store.get_worker(first)
    assert record is not None and record.role == WorkerRole.UPSTREAM.value
    assert {k: record.provenance[k] for k in ("server", "pid", "host", "config_version", "started_by")} == {
        "server": "notes",
        "pid": 101,
        "host": HOST,
        "config_version": "cfg-1",
        "started_by": "bastion",
    }
    assert record.provenance["launched_by"] == "gateway-20260501T120000Z-0123456789ab"

    await runtimes.mark_failed(first, "process 101 exited")
    second, second_epoch = await runtimes.register_launch("notes", 102, "cfg-1")

    assert second != first and second_epoch == first_epoch + 1
    failed = await store.get_worker(first)
    assert failed is not None and failed.failure_reason == "process 101 exited"
    current = runtimes.current("notes")
    assert current is not None and (current.worker, current.epoch, current.pid) == (second, 2, 102)
    slot = await store.get_generation("upstream:notes")
    assert slot is not None and (slot.holder, slot.epoch) == (second, 2)


async def test_failure_never_touches_other_servers(store: SqliteStore, clock: Clock) -> None:
    """Only the failed identity loses liveness; another namespace's runtime stays live and heartbeats."""
    runtimes = registry(store, clock)
    notes, _ = await runtimes.register_launch("notes", 101, "cfg")
    tools, _ = await runtimes.register_launch("tools", 201, "cfg")
    await runtimes.mark_failed(notes, "process 101 exited")
    clock.advance(1)
    await runtimes.heartbeat_once()
    kept = await store.get_worker(tools)
    assert kept is not None and kept.failed_at is None and kept.heartbeat_at == clock.now
    assert runtimes.current("notes") is None and runtimes.current("tools") is not None


async def test_a_launch_without_an_exit_marks_the_one_it_replaces(store: SqliteStore, clock: Clock) -> None:
    """Should the exit go unseen, the next launch of that server still fails the previous identity first."""
    runtimes = registry(store, clock)
    first, _ = await runtimes.register_launch("notes", 101, "cfg")
    second, epoch = await runtimes.register_launch("notes", 102, "cfg")
    replaced = await store.get_worker(first)
    assert replaced is not None and replaced.failure_reason == "replaced by a new launch"
    assert epoch == 2 and second != first
    with pytest.raises(StaleEpoch):
        await store.heartbeat(first, clock.now)


async def test_slots_are_per_owner_so_replicas_do_not_collide(store: SqliteStore, clock: Clock) -> None:
    """Two gateway generations each launching 'notes' claim different slots, both at epoch 1."""
    a = registry(store, clock, owner="g1")
    b = registry(store, clock, owner="g2")
    assert a.slot("notes") == "upstream:g1:notes" and registry(store, clock).slot("notes") == "upstream:notes"
    assert (await a.register_launch("notes", 101, "cfg"))[1] == 1
    assert (await b.register_launch("notes", 201, "cfg"))[1] == 1


async def test_a_dead_predecessor_of_a_restarted_gateway_is_withdrawn_at_once(
    store: SqliteStore, clock: Clock, dead_pid: int
) -> None:
    """A slot still held (fresh heartbeat) by a process now dead on this host is claimed without waiting."""
    before_restart = registry(store, clock, owner="g1")
    old, _ = await before_restart.register_launch("notes", dead_pid, "cfg")
    after_restart = registry(store, clock, owner="g1")
    clock.advance(1)
    new, epoch = await after_restart.register_launch("notes", os.getpid(), "cfg")
    assert epoch == 2 and new != old
    withdrawn = await store.get_worker(old)
    assert withdrawn is not None and withdrawn.withdrawn_at == clock.now


async def test_registration_refuses_identity_without_evidence(store: SqliteStore) -> None:
    """A runtime registration must carry pid, host and started_by; without them it is a duplicate."""
    from bastion.errors import Conflict

    with pytest.raises(Conflict) as caught:
        await register_identity(store, "upstream-x", WorkerRole.UPSTREAM, {"server": "x"}, now=T0)
    assert caught.value.data["missing"] == ["pid", "host", "started_by"]
    assert await store.list_workers() == []


class Signalling:
    """Proxies a store and sets an event after each claim and each failure mark."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.claimed = anyio.Event()
        self.failed = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def claim_generation(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._inner.claim_generation(*args, **kwargs)
        finally:
            self.claimed.set()

    async def mark_worker_failed(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._inner.mark_worker_failed(*args, **kwargs)
        finally:
            self.failed.set()


@dataclass
class FakeStdio:
    """What the hook reads from ``StdioUpstream``: its name and its current PID."""

    name: str
    pid: int | None


async def test_the_process_hook_registers_and_fails_in_order(
    store: SqliteStore, clock: Clock, live_child: subprocess.Popen[bytes]
) -> None:
    """started → a registered identity; exited → that identity failed; started again → a new one, epoch 2."""
    signalling = Signalling(store)
    runtimes = registry(signalling, clock)  # type: ignore[arg-type]
    hook = runtimes.process_hook("cfg-7")
    upstream = FakeStdio("notes", live_child.pid)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtimes.run)
            hook("started", upstream)
            await signalling.claimed.wait()
            first = runtimes.current("notes")
            assert first is not None and first.pid == live_child.pid
            signalling.claimed = anyio.Event()
            hook("exited", upstream)
            await signalling.failed.wait()
            assert runtimes.current("notes") is None
            upstream.pid = live_child.pid + 1
            hook("started", upstream)
            await signalling.claimed.wait()
            tg.cancel_scope.cancel()
    second = runtimes.current("notes")
    assert second is not None and second.worker != first.worker and second.epoch == 2
    failed = await store.get_worker(first.worker)
    assert failed is not None and failed.failure_reason == f"process {live_child.pid} exited"
    # After run() ended, the hook must never raise into the stdio supervisor.
    hook("exited", upstream)
    hook("ignored-kind", FakeStdio("notes", None))


async def _gateway(store: Store, clock: Clock, generation: str) -> WorkerId:
    record = await register_identity(
        store,
        "gateway",
        WorkerRole.GATEWAY,
        {"pid": os.getpid(), "host": HOST, "started_by": "pytest", "config_version": "cfg"},
        now=clock.now,
    )
    await store.claim_generation(generation, record.worker_id, now=clock.now, lease_s=LEASE_S)
    return record.worker_id


async def test_runtime_heartbeats_end_with_the_launching_gateway_s_epoch(
    store: SqliteStore, clock: Clock
) -> None:
    """Once the launching gateway is fenced, its runtimes are heartbeated no more (they expire with it)."""
    fenced = anyio.Event()

    async def fence() -> None:
        if fenced.is_set():
            raise StaleEpoch()

    runtimes = RuntimeRegistry(
        store, clock=clock, lease_s=LEASE_S, heartbeat_s=LEASE_S / 3, owner="g1", host=HOST, fence=fence
    )
    notes, _ = await runtimes.register_launch("notes", 101, "cfg")
    clock.advance(1)
    await runtimes.heartbeat_once()
    beaten_at = clock.now
    fenced.set()
    clock.advance(1)
    await runtimes.heartbeat_once()
    after = await store.get_worker(notes)
    assert after is not None and after.heartbeat_at == beaten_at


async def test_a_replacement_gateway_takes_the_runtime_slot_of_a_superseded_one_at_once(
    store: SqliteStore, clock: Clock
) -> None:
    """A runtime whose launching gateway lost its generation is withdrawn; the new launch claims its slot."""
    old_gateway = await _gateway(store, clock, "g1")
    old = RuntimeRegistry(
        store, clock=clock, lease_s=LEASE_S, heartbeat_s=1, owner="g1", launched_by=old_gateway, host=HOST
    )
    stale_runtime, _ = await old.register_launch("notes", os.getpid(), "cfg")  # a live PID
    # The old gateway stops heartbeating (paused); after its lease a replacement claims g1 at epoch 2,
    # while the old runtime's record is kept fresh (the race of issue #11 point 4).
    clock.advance(LEASE_S + 1)
    await store.heartbeat(stale_runtime, clock.now)
    new_gateway = await _gateway(store, clock, "g1")
    new = RuntimeRegistry(
        store, clock=clock, lease_s=LEASE_S, heartbeat_s=1, owner="g1", launched_by=new_gateway, host=HOST
    )
    with anyio.fail_after(5):
        fresh, epoch = await new.register_launch("notes", 102, "cfg")
    withdrawn = await store.get_worker(stale_runtime)
    assert epoch == 2 and fresh != stale_runtime
    assert withdrawn is not None and withdrawn.withdraw_reason == "its launching gateway was superseded"


async def test_a_store_outage_is_logged_once_not_every_heartbeat(
    store: SqliteStore, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A fence that keeps failing in an outage gives one warning, and one line when it works again (#23)."""
    failing = True

    async def fence() -> None:
        if failing:
            raise NotDurable("the write could not be made durable")

    runtimes = RuntimeRegistry(
        store, clock=clock, lease_s=LEASE_S, heartbeat_s=LEASE_S / 3, owner="g1", host=HOST, fence=fence
    )
    caplog.set_level("DEBUG", logger="bastion.workers.runtimes")
    for _ in range(5):
        await runtimes.heartbeat_once()
    failing = False
    await runtimes.heartbeat_once()
    await runtimes.heartbeat_once()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    infos = [r for r in caplog.records if r.levelname == "INFO" and "works again" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "heartbeating the upstream runtimes failed" in warnings[0].getMessage()
    assert len(infos) == 1
