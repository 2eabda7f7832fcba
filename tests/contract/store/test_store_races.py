"""Concurrent admission and appends (DESIGN sections 3, 4, 7): exactly one winner, no fork, no gap.

Tasks start together on an ``anyio.Event``; every wait is bounded by ``fail_after``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import pytest
from store_support import AGENT, EID, LEASE_S, NOW, Writer, assert_linked, builder, genesis, later, new_writer

from bastion.errors import BastionError, ExecutionCollision, ExecutionInFlight, StaleEpoch
from bastion.ids import CallId, EvidenceSessionId, WorkerId
from bastion.store.base import Reserved, Store

pytestmark = pytest.mark.anyio

TASKS = 64


async def race(n: int, attempt: Callable[[int], Awaitable[object]]) -> list[object]:
    """Run ``attempt(0..n-1)`` released together; return each result or BastionError."""
    start = anyio.Event()
    results: list[object] = []

    async def one(i: int) -> None:
        await start.wait()
        try:
            results.append(await attempt(i))
        except BastionError as exc:
            results.append(exc)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
            start.set()
    return results


def kinds(results: list[object]) -> Counter[str]:
    return Counter(type(r).__name__ for r in results)


def binding(n: int) -> str:
    return hashlib.sha256(f"race-{n}".encode()).hexdigest()


@pytest.mark.parametrize(
    ("bindings", "loser"), [("same", ExecutionInFlight), ("different", ExecutionCollision)]
)
async def test_concurrent_reservations_have_one_winner(
    store: Store, writer: Writer, bindings: str, loser: type[BastionError]
) -> None:
    """64 tasks reserve one key: exactly one Reserved, every other one refused as in flight or collision."""

    async def attempt(i: int) -> object:
        b = binding(0 if bindings == "same" else i)
        return await store.reserve_execution(
            AGENT, EID, b, call_id=CallId(f"c{i}"), worker=writer.worker, epoch=writer.epoch
        )

    results = await race(TASKS, attempt)
    assert kinds(results) == {"Reserved": 1, loser.__name__: TASKS - 1}
    (winner,) = [r for r in results if isinstance(r, Reserved)]
    assert await store.get_execution(AGENT, EID) == winner.record


async def test_two_replicas_race_for_one_key(store: Store, replica: Store, writer: Writer) -> None:
    """Two stores on the same data (two gateway replicas) race: still exactly one winner."""
    other = await new_writer(replica, "gw-b", "gateway-1")

    async def attempt(i: int) -> object:
        target, w = (store, writer) if i % 2 else (replica, other)
        return await target.reserve_execution(
            AGENT, EID, binding(0), call_id=CallId(f"c{i}"), worker=w.worker, epoch=w.epoch
        )

    results = await race(TASKS, attempt)
    assert kinds(results) == {"Reserved": 1, "ExecutionInFlight": TASKS - 1}


async def test_concurrent_appends_never_fork_or_gap(store: Store, writer: Writer) -> None:
    """32 appenders on one chain: seq 0..32 contiguous, every prev links, every hash recomputes."""
    session_id = EvidenceSessionId("ev_race")
    await store.open_chain(session_id, genesis(session_id), worker=writer.worker, epoch=writer.epoch)

    async def attempt(i: int) -> object:
        return await store.append_entry(
            session_id, builder(session_id, detail={"task": i}), worker=writer.worker, epoch=writer.epoch
        )

    results = await race(32, attempt)
    assert kinds(results) == {"AuditEntry": 32}
    entries = await store.read_chain(session_id)
    assert len(entries) == 33
    assert_linked(entries)
    assert sorted(e.detail["task"] for e in entries[1:] if e.detail) == list(range(32))


async def test_concurrent_appends_on_two_replicas(store: Store, replica: Store, writer: Writer) -> None:
    """Appends through two stores on one chain interleave without a fork."""
    other = await new_writer(replica, "gw-b", "gateway-1")
    session_id = EvidenceSessionId("ev_race2")
    await store.open_chain(session_id, genesis(session_id), worker=writer.worker, epoch=writer.epoch)

    async def attempt(i: int) -> object:
        target, w = (store, writer) if i % 2 else (replica, other)
        return await target.append_entry(session_id, builder(session_id), worker=w.worker, epoch=w.epoch)

    await race(32, attempt)
    entries = await replica.read_chain(session_id)
    assert len(entries) == 33
    assert_linked(entries)


async def test_racing_claims_of_a_fresh_generation_have_one_holder(store: Store, replica: Store) -> None:
    """16 workers on two replicas claim one new generation at once: one holds it at epoch 1, 15 Conflict."""
    for i in range(16):
        await (store if i % 2 else replica).register_worker(WorkerId(f"w{i}"), "gateway", {}, now=NOW)
    results = await race(
        16,
        lambda i: (store if i % 2 else replica).claim_generation(
            "contested", WorkerId(f"w{i}"), now=NOW, lease_s=LEASE_S
        ),
    )
    assert kinds(results) == {"int": 1, "Conflict": 15}
    held = await store.get_generation("contested")
    assert held is not None and held.epoch == 1
    assert results[[type(r) for r in results].index(int)] == 1


async def test_racing_takeovers_raise_the_epoch_once(store: Store, replica: Store, writer: Writer) -> None:
    """After the holder's lease ran out, 16 survivors race to take over: one wins at epoch + 1."""
    after = later(LEASE_S + 1)
    for i in range(16):
        await (store if i % 2 else replica).register_worker(WorkerId(f"s{i}"), "recovery", {}, now=after)
    results = await race(
        16,
        lambda i: (store if i % 2 else replica).claim_generation(
            writer.generation, WorkerId(f"s{i}"), now=after, lease_s=LEASE_S
        ),
    )
    assert kinds(results) == {"int": 1, "Conflict": 15}
    held = await replica.get_generation(writer.generation)
    assert held is not None and held.epoch == writer.epoch + 1
    with pytest.raises(StaleEpoch):  # the old holder's next write is refused
        await store.reserve_execution(
            AGENT, EID, binding(0), call_id=CallId("late"), worker=writer.worker, epoch=writer.epoch
        )
