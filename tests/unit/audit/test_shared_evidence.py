"""The evidence sessions sessionless requests share (``audit/shared.py``), on a real SQLite store.

Each test races or ages real chains and reads them back from the store, then
verifies every closed chain and its claim as ``bastion verify`` would.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from bastion.audit.claim import PolicyInForce
from bastion.audit.entry import AuditEntry, AuditEvent
from bastion.audit.export import entry_line
from bastion.audit.recorder import EvidenceRecorder
from bastion.audit.scope import EvidenceScope
from bastion.audit.shared import SharedEvidence
from bastion.audit.tee import no_attestation
from bastion.audit.verify import verify_bundle
from bastion.auth.principal import Principal
from bastion.crypto.keys import Keyring
from bastion.ids import AgentId, EvidenceSessionId
from bastion.store.sqlite import SqliteStore
from bastion.workers.membership import WorkerMembership
from tests.unit.audit.conftest import PROFILE

pytestmark = pytest.mark.anyio

ALICE = Principal(AgentId("alice"), agent_session_id="as-alice")
BOB = Principal(AgentId("bob"), agent_session_id="as-bob")


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    store: SqliteStore
    keyring: Keyring
    membership: WorkerMembership
    clock: Clock

    def shared(self, *, max_entries: int = 10_000, max_age_s: float = 60.0) -> SharedEvidence:
        """One gateway's shared chains (each gateway holds its own)."""
        recorder = EvidenceRecorder(
            self.store,
            self.keyring,
            self.membership,
            attest=lambda root: no_attestation("no TEE in tests"),
            profile=PROFILE,
            policy=lambda: PolicyInForce(bundle_hash="sha256:" + "cd" * 32),
            max_entries=max_entries,
            max_age_s=math.inf,  # as the gateway builds it: the age bound is SharedEvidence's
            monotonic=self.clock,
        )
        return SharedEvidence(recorder, max_age_s=max_age_s, policy_version=lambda: "t", monotonic=self.clock)

    async def verified(self, session_id: str) -> list[AuditEntry]:
        """The chain's entries, after verifying the chain and its claim (which must exist)."""
        entries = await self.store.read_chain(EvidenceSessionId(session_id))
        claim = await self.store.get_claim(EvidenceSessionId(session_id))
        assert claim is not None, f"no claim for {session_id}"
        verify_bundle([entry_line(e) for e in entries], key=self.keyring.active, claim=claim)
        return entries


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    store = await SqliteStore.open(tmp_path / "bastion.db")
    membership = WorkerMembership(
        store, "gateway-0", lease_s=30.0, heartbeat_s=1.0, clock=lambda: datetime.now(UTC)
    )
    await membership.join(config_version="t")
    try:
        yield World(store, Keyring.open(tmp_path), membership, Clock())
    finally:
        await store.aclose()


async def one_call(scope: EvidenceScope, call_id: str, *, sent: bool) -> list[AuditEntry]:
    """The writes of one tools/call: admitted (+ invoking, holding one slot) then its outcome."""
    fields: dict[str, Any] = {"call_id": call_id}
    entries: list[AuditEntry] = []
    try:
        if sent:
            entries += await scope.record_many(
                [(AuditEvent.ADMITTED, fields), (AuditEvent.INVOKING, fields)], then=1
            )
            await anyio.sleep(0)
            entries += await scope.record_many([(AuditEvent.COMPLETED, fields)], durable=False)
        else:
            entries += await scope.record_many(
                [(AuditEvent.ADMITTED, fields), (AuditEvent.COMPLETED, fields)], durable=False
            )
    finally:
        scope.end_call(call_id)
    return entries


async def race(shared: SharedEvidence, principal: Principal, calls: int) -> dict[str, list[AuditEntry]]:
    """``calls`` requests of one principal at once, each joining and leaving as the front door does."""
    out: dict[str, list[AuditEntry]] = {}

    async def request(index: int) -> None:
        scope = shared.join(principal)
        try:
            out[f"{principal.agent}-{index}"] = await one_call(
                scope, f"{principal.agent}-{index}", sent=index % 2 == 0
            )
        finally:
            shared.leave(scope)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for index in range(calls):
                tg.start_soon(request, index)
    return out


async def test_concurrent_requests_of_one_agent_append_to_one_chain_without_forks_or_gaps(
    world: World,
) -> None:
    """Forty requests of one agent at once: one chain, seq 0..n without a gap; links and claim verify."""
    shared = world.shared()
    calls = await race(shared, ALICE, 40)
    sessions = {entry.session_id for entries in calls.values() for entry in entries}
    assert len(sessions) == 1
    assert await shared.close_all() == list(sessions)
    entries = await world.verified(sessions.pop())
    assert [entry.seq for entry in entries] == list(range(len(entries)))
    assert len(entries) == 2 + sum(len(e) for e in calls.values()) + 1  # genesis, attestation, calls, close


async def test_rotation_under_concurrency_keeps_each_call_in_one_bounded_chain(world: World) -> None:
    """Under a small entry bound racing calls rotate chains; each call stays in one chain within the bound."""
    shared = world.shared(max_entries=9)
    calls = await race(shared, ALICE, 30)
    await shared.close_all()
    for call_id, entries in calls.items():
        assert len({entry.session_id for entry in entries}) == 1, call_id
    sessions = {entry.session_id for entries in calls.values() for entry in entries}
    assert len(sessions) > 3
    for session_id in sessions:
        chain = await world.verified(session_id)
        assert len(chain) <= 9
        assert [entry.seq for entry in chain] == list(range(len(chain)))


async def test_agents_and_agent_sessions_never_share_a_chain(world: World) -> None:
    """Alice, Bob, and Alice under another agent session race at once: three chains, each of one agent."""
    shared = world.shared()
    other = Principal(AgentId("alice"), agent_session_id="as-alice-2")
    results: list[dict[str, list[AuditEntry]]] = []

    async def run(principal: Principal) -> None:
        results.append(await race(shared, principal, 10))

    async with anyio.create_task_group() as tg:
        for principal in (ALICE, BOB, other):
            tg.start_soon(run, principal)
    chains = [{entry.session_id for entries in result.values() for entry in entries} for result in results]
    assert all(len(chain) == 1 for chain in chains)
    assert len(set.union(*chains)) == 3
    for session_id in await shared.close_all():
        entries = await world.verified(session_id)
        assert len({entry.agent for entry in entries}) == 1


async def test_two_gateways_on_one_store_keep_their_own_chains(world: World) -> None:
    """Two gateways' shared chains in one process never mix, even for the same agent session."""
    first, second = world.shared(), world.shared()
    one = await race(first, ALICE, 5)
    two = await race(second, ALICE, 5)
    chain_one = {entry.session_id for entries in one.values() for entry in entries}
    chain_two = {entry.session_id for entries in two.values() for entry in entries}
    assert len(chain_one) == len(chain_two) == 1 and chain_one != chain_two
    for shared in (first, second):
        for session_id in await shared.close_all():
            await world.verified(session_id)


async def test_an_idle_chain_past_its_age_closes_with_its_claim_and_is_forgotten(world: World) -> None:
    """With no traffic, the sweep closes a chain past its age bound (claim issued) and drops the key."""
    shared = world.shared(max_age_s=60.0)
    calls = await race(shared, ALICE, 3)
    session_id = next(iter(calls.values()))[0].session_id
    assert await shared.sweep() == []  # young: stays open
    assert await world.store.get_claim(EvidenceSessionId(session_id)) is None
    world.clock.now += 60.0
    assert await shared.sweep() == [session_id]
    assert (await world.verified(session_id))[-1].detail == {"close_reason": "rotation"}
    assert len(shared) == 0  # nothing of this client is left here
    again = await race(shared, ALICE, 1)
    assert next(iter(again.values()))[0].session_id != session_id


async def test_a_chain_past_its_age_closes_only_after_the_call_holding_a_slot_in_it(world: World) -> None:
    """The sweep leaves an aged chain open while a call holds a slot in it, and closes it after that call."""
    shared = world.shared(max_age_s=60.0)
    scope = shared.join(ALICE)
    fields = {"call_id": "slow"}
    first = await scope.record_many([(AuditEvent.ADMITTED, fields), (AuditEvent.INVOKING, fields)], then=1)
    world.clock.now += 61.0
    assert await shared.sweep() == []  # the slow call still holds its slot
    last = await scope.record_many([(AuditEvent.COMPLETED, fields)], durable=False)
    scope.end_call("slow")
    shared.leave(scope)
    assert await shared.sweep() == [first[0].session_id] == [last[0].session_id]
    entries = await world.verified(first[0].session_id)
    assert [entry.event for entry in entries[-3:]] == ["invoking", "completed", "session_close"]


async def test_past_its_age_new_requests_start_a_new_chain_while_old_ones_finish_in_theirs(
    world: World,
) -> None:
    """A request joining past the age bound gets a fresh chain at once; the slow one ends in the old chain."""
    shared = world.shared(max_age_s=60.0)
    slow = shared.join(ALICE)
    fields = {"call_id": "slow"}
    before = await slow.record_many([(AuditEvent.ADMITTED, fields), (AuditEvent.INVOKING, fields)], then=1)
    world.clock.now += 61.0
    with anyio.fail_after(5):  # nobody waits for the slow call to rotate
        fresh = await race(shared, ALICE, 3)
    new_chain = {entry.session_id for entries in fresh.values() for entry in entries}
    assert len(new_chain) == 1 and new_chain != {before[0].session_id}
    after = await slow.record_many([(AuditEvent.COMPLETED, fields)], durable=False)
    slow.end_call("slow")
    shared.leave(slow)
    assert after[0].session_id == before[0].session_id  # one call, one chain
    assert await shared.sweep() == [before[0].session_id]  # the old chain closes once quiet
    assert (await world.verified(before[0].session_id))[-1].detail == {"close_reason": "rotation"}
    assert await shared.close_all() == list(new_chain)


async def test_revocation_closes_only_that_agent_sessions_chain(world: World) -> None:
    """Closing one agent session's shared chain issues its claim and leaves another agent's chain open."""
    shared = world.shared()
    alice = await race(shared, ALICE, 2)
    bob = await race(shared, BOB, 2)
    alice_chain = next(iter(alice.values()))[0].session_id
    bob_chain = next(iter(bob.values()))[0].session_id
    assert shared.agent_sessions() == {"as-alice", "as-bob"}
    assert await shared.close_agent_session("as-alice") == [alice_chain]
    assert (await world.verified(alice_chain))[-1].detail == {"close_reason": "revocation"}
    assert await world.store.get_claim(EvidenceSessionId(bob_chain)) is None
    assert await shared.close_all() == [bob_chain]
    assert (await world.verified(bob_chain))[-1].detail == {"close_reason": "shutdown"}
