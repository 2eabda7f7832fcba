"""Liveness (DESIGN section 6): heartbeat freshness alone, and a PID known dead here withdraws it at once."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta
from typing import Any

import pytest
from workers_support import HOST, LEASE_S, T0, Clock

from bastion.ids import WorkerId
from bastion.store.base import WorkerRecord
from bastion.store.sqlite import SqliteStore
from bastion.workers import liveness
from bastion.workers.liveness import Liveness, is_live, liveness_of, pid_alive, pid_known_dead
from bastion.workers.withdrawal import withdraw_if_dead

pytestmark = pytest.mark.anyio


def record(pid: Any, *, host: str = HOST, heartbeat_age_s: float = 0.0, **extra: Any) -> WorkerRecord:
    return WorkerRecord(
        WorkerId("gateway-20260501T120000Z-0123456789ab"),
        "gateway",
        {"pid": pid, "host": host, "started_by": "pytest"},
        T0,
        T0 - timedelta(seconds=heartbeat_age_s),
        "g1",
        **extra,
    )


def test_pid_alive_asks_the_operating_system(dead_pid: int, live_child: subprocess.Popen[bytes]) -> None:
    """A running child is alive, a killed and reaped one is dead, and this process is alive."""
    assert pid_alive(os.getpid())
    assert pid_alive(live_child.pid)
    assert not pid_alive(dead_pid)


def test_permission_denied_means_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """PermissionError says the process exists (it belongs to someone else): alive."""

    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(liveness.os, "kill", refuse)
    assert pid_alive(12345)


def test_non_positive_pids_are_never_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """kill(0) and kill(-1) address process groups: such a PID is unknown, never dead."""
    monkeypatch.setattr(liveness.os, "kill", lambda pid, sig: pytest.fail("probed a process group"))
    assert pid_alive(0) and pid_alive(-1)


def test_expired_heartbeat_with_a_live_pid_stays_not_live(live_child: subprocess.Popen[bytes]) -> None:
    """A live PID cannot resurrect an expired record: heartbeat freshness alone decides."""
    expired = record(live_child.pid, heartbeat_age_s=LEASE_S)
    verdict = liveness_of(expired, T0, LEASE_S, pid_alive=pid_alive, this_host=HOST)
    assert verdict is Liveness.EXPIRED
    assert not is_live(expired, T0, LEASE_S, pid_alive=pid_alive, this_host=HOST)
    fresh = record(live_child.pid, heartbeat_age_s=LEASE_S - 0.001)
    assert is_live(fresh, T0, LEASE_S, pid_alive=pid_alive, this_host=HOST)


def test_dead_pid_on_this_host_withdraws_liveness_at_once(dead_pid: int) -> None:
    """A fresh heartbeat does not keep a record live once its PID is known dead on this host."""
    fresh = record(dead_pid, heartbeat_age_s=0.0)
    assert pid_known_dead(fresh, pid_alive=pid_alive, this_host=HOST)
    assert liveness_of(fresh, T0, LEASE_S, pid_alive=pid_alive, this_host=HOST) is Liveness.PID_DEAD
    assert not is_live(fresh, T0, LEASE_S, pid_alive=pid_alive, this_host=HOST)


@pytest.mark.parametrize(
    "provenance",
    [
        {"pid": 4242, "host": "another-host"},
        {"host": HOST},
        {"pid": "4242", "host": HOST},
        {"pid": True, "host": HOST},
        {"pid": -3, "host": HOST},
    ],
    ids=["other-host", "no-pid", "pid-not-int", "pid-bool", "pid-negative"],
)
def test_a_pid_is_only_known_dead_when_it_is_ours_to_ask(provenance: dict[str, Any]) -> None:
    """Another host's PID, or a missing or malformed one, is unknown: heartbeat freshness decides."""
    fresh = WorkerRecord(WorkerId("w"), "gateway", provenance, T0, T0, "g1")
    everything_dead = lambda pid: False  # noqa: E731 - a probe that would call any PID dead
    assert not pid_known_dead(fresh, pid_alive=everything_dead, this_host=HOST)
    assert is_live(fresh, T0, LEASE_S, pid_alive=everything_dead, this_host=HOST)


def test_recorded_withdrawal_and_failure_are_final() -> None:
    """A withdrawn or failed record is not live, whatever its heartbeat and PID say."""
    withdrawn = record(os.getpid(), withdrawn_at=T0, withdraw_reason="pid dead")
    failed = record(os.getpid(), failed_at=T0, failure_reason="exited")
    assert liveness_of(withdrawn, T0, LEASE_S, pid_alive=pid_alive, this_host=HOST) is Liveness.WITHDRAWN
    assert liveness_of(failed, T0, LEASE_S, pid_alive=pid_alive, this_host=HOST) is Liveness.FAILED


async def test_withdraw_if_dead_lets_a_claim_succeed_at_once(
    store: SqliteStore, clock: Clock, dead_pid: int
) -> None:
    """Before claiming, a holder whose PID is dead here is withdrawn; the claim then wins inside its lease."""
    holder = WorkerId("gateway-20260501T120000Z-aaaaaaaaaaaa")
    await store.register_worker(holder, "gateway", {"pid": dead_pid, "host": HOST, "started_by": "t"}, now=T0)
    assert await store.claim_generation("g1", holder, now=T0, lease_s=LEASE_S) == 1
    successor = WorkerId("gateway-20260501T120001Z-bbbbbbbbbbbb")
    await store.register_worker(
        successor, "gateway", {"pid": os.getpid(), "host": HOST, "started_by": "t"}, now=T0
    )

    withdrawn = await withdraw_if_dead(store, "g1", this_host=HOST, pid_alive=pid_alive, now=clock.advance(1))

    assert withdrawn is not None and withdrawn.worker_id == holder and withdrawn.withdrawn_at == clock.now
    assert await store.claim_generation("g1", successor, now=clock.now, lease_s=LEASE_S) == 2


async def test_withdraw_if_dead_leaves_live_unknown_and_missing_holders_alone(
    store: SqliteStore, clock: Clock, live_child: subprocess.Popen[bytes]
) -> None:
    """A live PID, another host's PID, and an unclaimed generation are never withdrawn."""
    assert await withdraw_if_dead(store, "nothing", this_host=HOST, pid_alive=pid_alive, now=T0) is None
    for n, (pid, host) in enumerate([(live_child.pid, HOST), (live_child.pid + 10**6, "elsewhere")]):
        worker = WorkerId(f"gateway-20260501T120000Z-{n:012d}")
        await store.register_worker(worker, "gateway", {"pid": pid, "host": host, "started_by": "t"}, now=T0)
        await store.claim_generation(f"g{n}", worker, now=T0, lease_s=LEASE_S)
        assert await withdraw_if_dead(store, f"g{n}", this_host=HOST, pid_alive=pid_alive, now=T0) is None
        current = await store.get_worker(worker)
        assert current is not None and current.withdrawn_at is None
