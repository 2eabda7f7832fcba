"""The worker registry (DESIGN §6, seed 004): identities never adopted; provenance apart from ownership.

Owning sessions come only from live attachment records whose writer still
holds its claim; with none, ownership reads ``unproven``. A real SQLite store
and an injected clock.
"""

from __future__ import annotations

import os

import pytest
from workers_support import HOST, LEASE_S, T0, Clock

from bastion.errors import Conflict
from bastion.ids import WorkerId
from bastion.store.sqlite import SqliteStore
from bastion.workers import registry as registry_module
from bastion.workers.liveness import Liveness, pid_alive
from bastion.workers.registry import (
    CohortStanding,
    WorkerRole,
    WorkerView,
    describe_workers,
    missing_identity_evidence,
    register_identity,
)

pytestmark = pytest.mark.anyio

EVIDENCE = {"pid": os.getpid(), "host": HOST, "started_by": "pytest"}


async def views(store: SqliteStore, clock: Clock) -> dict[str, WorkerView]:
    found = await describe_workers(store, now=clock.now, lease_s=LEASE_S, pid_alive=pid_alive, this_host=HOST)
    return {v.worker_id: v for v in found}


async def test_registering_an_existing_identity_is_refused_and_the_first_stands(store: SqliteStore) -> None:
    """Duplicate identity registration fails closed: never replaced, adopted or merged."""
    first = await register_identity(store, "gateway", WorkerRole.GATEWAY, EVIDENCE, now=T0)
    with pytest.raises(Conflict):
        await store.register_worker(first.worker_id, "gateway", {**EVIDENCE, "pid": 1}, now=T0)
    assert await store.get_worker(first.worker_id) == first


async def test_a_collision_mints_another_identity_instead_of_adopting(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the minted identity exists, registration mints another; the existing record is untouched."""
    taken = await register_identity(store, "gateway", WorkerRole.GATEWAY, EVIDENCE, now=T0)
    fresh = WorkerId("gateway-20260501T120000Z-ffffffffffff")
    minted = iter([taken.worker_id, fresh])
    monkeypatch.setattr(registry_module, "mint_worker_id", lambda name, now: next(minted))
    registered = await register_identity(store, "gateway", WorkerRole.GATEWAY, {**EVIDENCE, "pid": 2}, now=T0)
    assert registered.worker_id == fresh
    assert await store.get_worker(taken.worker_id) == taken


async def test_no_identity_evidence_is_a_duplicate(store: SqliteStore) -> None:
    """Without pid, host and started_by a registration is refused; a legacy record shows as a duplicate."""
    with pytest.raises(Conflict):
        await register_identity(store, "gateway", WorkerRole.GATEWAY, {"pid": 1, "host": HOST}, now=T0)
    assert missing_identity_evidence("x", {}) == ("minted identity", "pid", "host", "started_by")
    await store.register_worker(WorkerId("legacy"), "gateway", {}, now=T0)
    legacy = (await views(store, Clock()))["legacy"]
    assert legacy.standing is CohortStanding.DUPLICATE
    assert legacy.to_json()["cohort_standing"] == "duplicate"


async def test_ownership_comes_only_from_live_attachments_of_a_current_claim(
    store: SqliteStore, clock: Clock
) -> None:
    """Owners are proven while the writer holds its epoch; once it is superseded they read 'unproven'."""
    gateway = await register_identity(store, "gateway", WorkerRole.GATEWAY, EVIDENCE, now=T0)
    epoch = await store.claim_generation("g1", gateway.worker_id, now=T0, lease_s=LEASE_S)
    runtime = await register_identity(
        store, "upstream-notes", WorkerRole.UPSTREAM, {**EVIDENCE, "cohort": "upstream:notes"}, now=T0
    )
    await store.claim_generation("upstream:g1:notes", runtime.worker_id, now=T0, lease_s=LEASE_S)
    idle = await register_identity(store, "upstream-tools", WorkerRole.UPSTREAM, EVIDENCE, now=T0)
    for ref in ("ts_b", "ts_a"):
        await store.record_attachment(
            runtime.worker_id, ref, "notes", T0, writer=gateway.worker_id, epoch=epoch
        )
    await store.record_attachment(
        gateway.worker_id, "ts_a", "tools", T0, writer=gateway.worker_id, epoch=epoch
    )

    shown = await views(store, clock)
    assert shown[runtime.worker_id].owning_sessions == ("ts_a", "ts_b")
    assert shown[gateway.worker_id].owning_sessions == ("ts_a",)
    assert shown[idle.worker_id].owning_sessions is None
    assert shown[idle.worker_id].to_json()["owning_sessions"] == "unproven"
    # Launch provenance is still answered, separately, for every worker.
    assert shown[idle.worker_id].to_json()["provenance"]["started_by"] == "pytest"
    assert (shown[gateway.worker_id].epoch, shown[gateway.worker_id].holds_generation) == (1, True)
    assert shown[runtime.worker_id].cohort == "upstream:notes" and shown[gateway.worker_id].cohort_live == 1

    # The writer's lease runs out and a successor claims g1: its records prove nothing any more.
    clock.advance(LEASE_S)
    await store.heartbeat(runtime.worker_id, clock.now)
    successor = await register_identity(store, "gateway", WorkerRole.GATEWAY, EVIDENCE, now=clock.now)
    await store.claim_generation("g1", successor.worker_id, now=clock.now, lease_s=LEASE_S)
    shown = await views(store, clock)
    old = shown[gateway.worker_id]
    assert old.liveness is Liveness.EXPIRED and not old.holds_generation
    assert old.to_json()["superseded"] is True and old.to_json()["epoch"] == 1
    assert shown[runtime.worker_id].liveness is Liveness.LIVE
    assert shown[runtime.worker_id].owning_sessions is None  # written under a claim no longer current


async def test_a_failed_worker_owns_nothing_and_says_why(store: SqliteStore, clock: Clock) -> None:
    """A failed identity shows its failure; its attachment records no longer prove ownership."""
    gateway = await register_identity(store, "gateway", WorkerRole.GATEWAY, EVIDENCE, now=T0)
    epoch = await store.claim_generation("g1", gateway.worker_id, now=T0, lease_s=LEASE_S)
    runtime = await register_identity(store, "upstream-notes", WorkerRole.UPSTREAM, EVIDENCE, now=T0)
    await store.record_attachment(
        runtime.worker_id, "ts_a", "notes", T0, writer=gateway.worker_id, epoch=epoch
    )
    await store.mark_worker_failed(runtime.worker_id, "process 9 exited", T0)
    shown = (await views(store, clock))[runtime.worker_id]
    assert shown.liveness is Liveness.FAILED and shown.owning_sessions is None
    assert shown.to_json()["failure_reason"] == "process 9 exited"


async def test_describe_refuses_a_non_positive_lease(store: SqliteStore) -> None:
    """Liveness needs a lease: zero would call every worker dead."""
    with pytest.raises(ValueError):
        await describe_workers(store, now=T0, lease_s=0, pid_alive=pid_alive, this_host=HOST)
