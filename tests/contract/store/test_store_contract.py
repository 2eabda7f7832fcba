"""The store contract (DESIGN sections 3, 4, 6, 7): executions, fencing, recovery, audit chains."""

from __future__ import annotations

import hashlib

import pytest
from store_support import (
    AGENT,
    EID,
    LEASE_S,
    NOW,
    Writer,
    assert_linked,
    builder,
    genesis,
    later,
    make_entry,
    new_writer,
)

from bastion.admission.states import TERMINAL_STATES, ExecutionState
from bastion.audit.entry import GENESIS_PREV, AuditEntry
from bastion.errors import (
    Conflict,
    ExecutionCollision,
    ExecutionInFlight,
    ExecutionReplay,
    StaleEpoch,
    StoreError,
)
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.base import Readmitted, Reserved, Store

pytestmark = pytest.mark.anyio

OTHER_AGENT = AgentId("agent-2")
TERMINALS = sorted(TERMINAL_STATES)


def binding(n: int = 0) -> str:
    return hashlib.sha256(f"binding-{n}".encode()).hexdigest()


async def reserve(
    store: Store, w: Writer, eid: ExecutionId = EID, b: str | None = None, *, call: str = "c1"
) -> object:
    return await store.reserve_execution(
        AGENT, eid, binding() if b is None else b, call_id=CallId(call), worker=w.worker, epoch=w.epoch
    )


async def drive(store: Store, w: Writer, target: ExecutionState, eid: ExecutionId = EID) -> None:
    """Reserve ``eid`` and move it along legal edges to ``target``."""
    await reserve(store, w, eid)
    if target is ExecutionState.RELEASED:
        await store.release_execution(AGENT, eid, worker=w.worker, epoch=w.epoch)
    elif target is not ExecutionState.RESERVED:
        await store.mark_invoking(AGENT, eid, worker=w.worker, epoch=w.epoch)
        if target is not ExecutionState.INVOKING:
            await store.record_outcome(AGENT, eid, target, worker=w.worker, epoch=w.epoch)


async def state_of(store: Store, eid: ExecutionId = EID, agent: AgentId = AGENT) -> ExecutionState | None:
    record = await store.get_execution(agent, eid)
    return None if record is None else record.state


# ---------------------------------------------------------------- reservation


async def test_reserve_inserts_a_reserved_row_with_its_binding(store: Store, writer: Writer) -> None:
    """A new key is reserved with its binding, attempt and writer."""
    outcome = await reserve(store, writer)
    assert isinstance(outcome, Reserved)
    record = await store.get_execution(AGENT, EID)
    assert record == outcome.record
    assert (record.state, record.binding, record.call_id) == (ExecutionState.RESERVED, binding(), "c1")
    assert (record.worker, record.epoch, record.generation) == (
        writer.worker,
        writer.epoch,
        writer.generation,
    )


async def test_unknown_execution_reads_as_none(store: Store) -> None:
    """An unreserved key has no row."""
    assert await store.get_execution(AGENT, EID) is None


async def test_different_binding_is_a_collision_and_changes_nothing(store: Store, writer: Writer) -> None:
    """Same key, another binding: ExecutionCollision naming the execution_id; the row keeps its binding."""
    await reserve(store, writer)
    with pytest.raises(ExecutionCollision) as caught:
        await reserve(store, writer, b=binding(1), call="c2")
    assert caught.value.data == {"execution_id": EID}
    record = await store.get_execution(AGENT, EID)
    assert record is not None and (record.binding, record.call_id) == (binding(), "c1")


@pytest.mark.parametrize("state", [ExecutionState.RESERVED, ExecutionState.INVOKING])
async def test_same_binding_in_flight_is_refused(store: Store, writer: Writer, state: ExecutionState) -> None:
    """Same key and binding while reserved or invoking: ExecutionInFlight, row unchanged."""
    await drive(store, writer, state)
    with pytest.raises(ExecutionInFlight) as caught:
        await reserve(store, writer, call="c2")
    assert caught.value.data["execution_id"] == EID
    assert await state_of(store) is state


@pytest.mark.parametrize("terminal", TERMINALS)
async def test_replay_after_every_terminal_state(
    store: Store, writer: Writer, terminal: ExecutionState
) -> None:
    """Same key and binding after any terminal state: ExecutionReplay naming the earlier outcome and call."""
    await drive(store, writer, terminal)
    with pytest.raises(ExecutionReplay) as caught:
        await reserve(store, writer, call="c2")
    assert caught.value.data == {
        "execution_id": EID,
        "earlier_outcome": terminal.value,
        "earlier_call_id": "c1",
    }
    assert await state_of(store) is terminal


@pytest.mark.parametrize("terminal", TERMINALS)
async def test_other_binding_after_terminal_is_a_collision(
    store: Store, writer: Writer, terminal: ExecutionState
) -> None:
    """A mutated operation is a collision even when the key is spent."""
    await drive(store, writer, terminal)
    with pytest.raises(ExecutionCollision):
        await reserve(store, writer, b=binding(1), call="c2")


async def test_released_row_is_readmitted_with_the_same_binding_only(store: Store, writer: Writer) -> None:
    """A released key is reserved again by the same binding, and collides with another."""
    await drive(store, writer, ExecutionState.RELEASED)
    with pytest.raises(ExecutionCollision):
        await reserve(store, writer, b=binding(1), call="c2")
    outcome = await reserve(store, writer, call="c3")
    assert isinstance(outcome, Readmitted)
    assert (outcome.record.state, outcome.record.call_id) == (ExecutionState.RESERVED, "c3")
    with pytest.raises(ExecutionInFlight):
        await reserve(store, writer, call="c4")


async def test_same_execution_id_under_two_agents_does_not_collide(store: Store, writer: Writer) -> None:
    """The key is (agent, execution_id): another agent's identical value is a different row."""
    await drive(store, writer, ExecutionState.COMPLETED)
    outcome = await store.reserve_execution(
        OTHER_AGENT, EID, binding(1), call_id=CallId("c9"), worker=writer.worker, epoch=writer.epoch
    )
    assert isinstance(outcome, Reserved)
    assert await state_of(store, agent=OTHER_AGENT) is ExecutionState.RESERVED
    assert await state_of(store) is ExecutionState.COMPLETED


async def test_malformed_binding_is_refused(store: Store, writer: Writer) -> None:
    """A binding that is not a SHA-256 hex digest is a programming error, refused before any write."""
    with pytest.raises(ValueError):
        await reserve(store, writer, b="sha256:" + binding())
    assert await state_of(store) is None


# ---------------------------------------------------------------- transitions


async def test_legal_path_reserved_invoking_completed(store: Store, writer: Writer) -> None:
    """The normal path moves along the table and records the writer on each step."""
    await reserve(store, writer)
    invoking = await store.mark_invoking(AGENT, EID, worker=writer.worker, epoch=writer.epoch)
    assert invoking.state is ExecutionState.INVOKING
    done = await store.record_outcome(
        AGENT, EID, ExecutionState.COMPLETED, worker=writer.worker, epoch=writer.epoch
    )
    assert done.state is ExecutionState.COMPLETED
    assert await state_of(store) is ExecutionState.COMPLETED


async def test_record_outcome_needs_a_terminal_state(store: Store, writer: Writer) -> None:
    """record_outcome with a non-terminal state raises ValueError and writes nothing."""
    await drive(store, writer, ExecutionState.INVOKING)
    for state in (ExecutionState.RESERVED, ExecutionState.RELEASED, ExecutionState.INVOKING):
        with pytest.raises(ValueError):
            await store.record_outcome(AGENT, EID, state, worker=writer.worker, epoch=writer.epoch)
    assert await state_of(store) is ExecutionState.INVOKING


@pytest.mark.parametrize(
    ("start", "operation"),
    [
        (ExecutionState.RESERVED, "record_outcome"),
        (ExecutionState.INVOKING, "mark_invoking"),
        (ExecutionState.INVOKING, "release_execution"),
        (ExecutionState.RELEASED, "mark_invoking"),
        (ExecutionState.RELEASED, "release_execution"),
        (ExecutionState.RELEASED, "record_outcome"),
        *[
            (terminal, op)
            for terminal in TERMINALS
            for op in ("mark_invoking", "release_execution", "record_outcome")
        ],
    ],
)
async def test_illegal_transition_is_a_conflict(
    store: Store, writer: Writer, start: ExecutionState, operation: str
) -> None:
    """A transition the table lacks raises Conflict and leaves the row as it was."""
    await drive(store, writer, start)
    with pytest.raises(Conflict) as caught:
        if operation == "record_outcome":
            await store.record_outcome(
                AGENT, EID, ExecutionState.FAILED, worker=writer.worker, epoch=writer.epoch
            )
        else:
            await getattr(store, operation)(AGENT, EID, worker=writer.worker, epoch=writer.epoch)
    assert caught.value.data["from_state"] == start.value
    assert await state_of(store) is start


@pytest.mark.parametrize("operation", ["mark_invoking", "release_execution"])
async def test_transition_of_a_missing_row_is_a_conflict(
    store: Store, writer: Writer, operation: str
) -> None:
    """No row, no transition: Conflict, and still no row."""
    with pytest.raises(Conflict):
        await getattr(store, operation)(AGENT, EID, worker=writer.worker, epoch=writer.epoch)
    assert await state_of(store) is None


async def test_another_generation_cannot_move_a_row(store: Store, writer: Writer) -> None:
    """A row belongs to the generation that reserved it; another replica's worker is refused."""
    other = await new_writer(store, "gw-b", "gateway-1")
    await reserve(store, writer)
    with pytest.raises(Conflict):
        await store.mark_invoking(AGENT, EID, worker=other.worker, epoch=other.epoch)
    with pytest.raises(ExecutionInFlight):
        await reserve(store, other, call="c2")
    assert await state_of(store) is ExecutionState.RESERVED


# ---------------------------------------------------------------- workers and fencing


async def test_register_existing_worker_fails_closed(store: Store) -> None:
    """A worker identity is never replaced: the second registration is a Conflict, the first stands."""
    first = await store.register_worker(WorkerId("w"), "gateway", {"pid": 1}, now=NOW)
    with pytest.raises(Conflict):
        await store.register_worker(WorkerId("w"), "upstream", {"pid": 2}, now=later(1))
    assert await store.get_worker(WorkerId("w")) == first
    assert dict(first.provenance) == {"pid": 1} and first.generation is None


async def test_first_claim_is_epoch_one_and_live_holder_keeps_it(store: Store) -> None:
    """An unclaimed generation starts at 1; a live holder's generation cannot be claimed, even by itself."""
    a = await new_writer(store, "w-a", "gen")
    assert a.epoch == 1
    await store.register_worker(WorkerId("w-b"), "gateway", {}, now=NOW)
    with pytest.raises(Conflict):
        await store.claim_generation("gen", WorkerId("w-b"), now=later(LEASE_S - 0.001), lease_s=LEASE_S)
    with pytest.raises(Conflict):
        await store.claim_generation("gen", a.worker, now=later(1), lease_s=LEASE_S)
    generation = await store.get_generation("gen")
    assert generation is not None and (generation.holder, generation.epoch) == (a.worker, 1)


async def test_takeover_after_expiry_raises_the_epoch(store: Store) -> None:
    """Heartbeat freshness alone decides: at exactly lease_s without a heartbeat the holder is superseded."""
    a = await new_writer(store, "w-a", "gen")
    await store.register_worker(WorkerId("w-b"), "gateway", {}, now=NOW)
    epoch = await store.claim_generation("gen", WorkerId("w-b"), now=later(LEASE_S), lease_s=LEASE_S)
    assert epoch == a.epoch + 1
    generation = await store.get_generation("gen")
    assert generation is not None and (generation.holder, generation.epoch) == ("w-b", epoch)
    claimant = await store.get_worker(WorkerId("w-b"))
    assert claimant is not None and claimant.generation == "gen" and claimant.is_live(later(LEASE_S), LEASE_S)


async def test_heartbeat_keeps_a_generation(store: Store) -> None:
    """A heartbeat moves liveness forward; it never moves it backwards."""
    a = await new_writer(store, "w-a", "gen")
    await store.heartbeat(a.worker, later(20))
    await store.heartbeat(a.worker, later(5))
    record = await store.get_worker(a.worker)
    assert record is not None and record.heartbeat_at == later(20)
    await store.register_worker(WorkerId("w-b"), "gateway", {}, now=NOW)
    with pytest.raises(Conflict):
        await store.claim_generation("gen", WorkerId("w-b"), now=later(LEASE_S + 1), lease_s=LEASE_S)


async def test_claim_refusals(store: Store) -> None:
    """Unknown workers and workers holding another generation cannot claim."""
    with pytest.raises(Conflict):
        await store.claim_generation("gen", WorkerId("nobody"), now=NOW, lease_s=LEASE_S)
    a = await new_writer(store, "w-a", "gen")
    with pytest.raises(Conflict):
        await store.claim_generation("other-gen", a.worker, now=later(LEASE_S * 2), lease_s=LEASE_S)
    assert await store.get_generation("other-gen") is None


async def test_superseded_worker_cannot_heartbeat_itself_live(store: Store) -> None:
    """After a takeover the old holder's heartbeat raises StaleEpoch; an unknown worker's is a Conflict."""
    a = await new_writer(store, "w-a", "gen")
    await new_writer(store, "w-b", "gen", now=later(LEASE_S))
    with pytest.raises(StaleEpoch):
        await store.heartbeat(a.worker, later(LEASE_S + 1))
    with pytest.raises(Conflict):
        await store.heartbeat(WorkerId("nobody"), NOW)


async def test_naive_times_are_refused(store: Store) -> None:
    """Store times are timezone-aware; a naive datetime is a programming error."""
    with pytest.raises(ValueError):
        await store.register_worker(WorkerId("w"), "gateway", {}, now=NOW.replace(tzinfo=None))
    assert await store.get_worker(WorkerId("w")) is None


async def stale_pair(store: Store) -> tuple[Writer, Writer]:
    """``a`` held gen at epoch 1; ``b`` took it over at epoch 2."""
    a = await new_writer(store, "w-a", "gen")
    b = await new_writer(store, "w-b", "gen", now=later(LEASE_S))
    return a, b


async def test_stale_epoch_reservation_writes_nothing(store: Store) -> None:
    """A superseded worker's reservation raises StaleEpoch and leaves no row."""
    a, _ = await stale_pair(store)
    with pytest.raises(StaleEpoch) as caught:
        await reserve(store, a)
    assert caught.value.data == {"epoch": 1, "current_epoch": 2}
    assert await state_of(store) is None


async def test_stale_epoch_transitions_write_nothing(store: Store) -> None:
    """Every transition by a stale writer raises StaleEpoch; the row keeps its state and writer."""
    a = await new_writer(store, "w-a", "gen")
    await drive(store, a, ExecutionState.INVOKING)
    await drive(store, a, ExecutionState.RESERVED, ExecutionId("exec-2"))
    await new_writer(store, "w-b", "gen", now=later(LEASE_S))
    with pytest.raises(StaleEpoch):
        await store.record_outcome(AGENT, EID, ExecutionState.COMPLETED, worker=a.worker, epoch=a.epoch)
    with pytest.raises(StaleEpoch):
        await store.mark_invoking(AGENT, ExecutionId("exec-2"), worker=a.worker, epoch=a.epoch)
    with pytest.raises(StaleEpoch):
        await store.release_execution(AGENT, ExecutionId("exec-2"), worker=a.worker, epoch=a.epoch)
    record = await store.get_execution(AGENT, EID)
    assert record is not None and (record.state, record.worker, record.epoch) == ("invoking", "w-a", 1)
    assert await state_of(store, ExecutionId("exec-2")) is ExecutionState.RESERVED


@pytest.mark.parametrize("case", ["higher_epoch", "unregistered", "unclaimed"])
async def test_writer_without_a_current_claim_is_fenced(store: Store, case: str) -> None:
    """Only the holder at exactly its epoch writes: a forged epoch, an unknown or unclaimed worker cannot."""
    a = await new_writer(store, "w-a", "gen")
    if case == "higher_epoch":
        fake = Writer(a.worker, Epoch(a.epoch + 1), "gen")
    elif case == "unregistered":
        fake = Writer(WorkerId("ghost"), Epoch(1), "gen")
    else:
        await store.register_worker(WorkerId("idle"), "gateway", {}, now=NOW)
        fake = Writer(WorkerId("idle"), Epoch(1), "gen")
    with pytest.raises(StaleEpoch):
        await reserve(store, fake)
    assert await state_of(store) is None


async def test_stale_epoch_audit_writes_nothing(store: Store) -> None:
    """A stale writer can neither open, append to, close nor claim a chain."""
    a = await new_writer(store, "w-a", "gen")
    session_id = EvidenceSessionId("ev_1")
    await store.open_chain(session_id, genesis(session_id), worker=a.worker, epoch=a.epoch)
    b = await new_writer(store, "w-b", "gen", now=later(LEASE_S))
    with pytest.raises(StaleEpoch):
        await store.open_chain(EvidenceSessionId("ev_2"), genesis("ev_2"), worker=a.worker, epoch=a.epoch)
    with pytest.raises(StaleEpoch):
        await store.append_entry(session_id, builder(session_id), worker=a.worker, epoch=a.epoch)
    with pytest.raises(StaleEpoch):
        await store.close_chain(session_id, worker=a.worker, epoch=a.epoch)
    await store.close_chain(session_id, worker=b.worker, epoch=b.epoch)
    with pytest.raises(StaleEpoch):
        await store.store_claim(session_id, {"claim": 1}, worker=a.worker, epoch=a.epoch)
    assert await store.get_chain(EvidenceSessionId("ev_2")) is None
    assert [e.seq for e in await store.read_chain(session_id)] == [0]
    assert await store.get_claim(session_id) is None


# ---------------------------------------------------------------- recovery


async def test_recovery_settles_what_the_dead_worker_left(store: Store) -> None:
    """invoking → outcome_unknown, reserved → released, terminal rows stay; all under the new epoch."""
    a = await new_writer(store, "w-a", "gen")
    other = await new_writer(store, "w-other", "gen-other")
    await drive(store, a, ExecutionState.RESERVED, ExecutionId("e-reserved"))
    await drive(store, a, ExecutionState.INVOKING, ExecutionId("e-invoking"))
    await drive(store, a, ExecutionState.COMPLETED, ExecutionId("e-done"))
    await drive(store, a, ExecutionState.RELEASED, ExecutionId("e-released"))
    await drive(store, other, ExecutionState.INVOKING, ExecutionId("e-other"))
    b = await new_writer(store, "w-b", "gen", now=later(LEASE_S))

    recovered = await store.recover_worker("gen", new_worker=b.worker, new_epoch=b.epoch)

    assert [(r.execution_id, r.previous_state, r.state) for r in recovered] == [
        ("e-invoking", ExecutionState.INVOKING, ExecutionState.OUTCOME_UNKNOWN),
        ("e-reserved", ExecutionState.RESERVED, ExecutionState.RELEASED),
    ]
    assert all((r.previous_worker, r.previous_epoch, r.binding) == ("w-a", 1, binding()) for r in recovered)
    record = await store.get_execution(AGENT, ExecutionId("e-invoking"))
    assert record is not None and (record.state, record.worker, record.epoch) == ("outcome_unknown", "w-b", 2)
    assert await state_of(store, ExecutionId("e-done")) is ExecutionState.COMPLETED
    assert await state_of(store, ExecutionId("e-other")) is ExecutionState.INVOKING
    # The uncertain outcome is a replay; the released one may be re-admitted by the new holder.
    with pytest.raises(ExecutionReplay) as caught:
        await reserve(store, b, ExecutionId("e-invoking"))
    assert caught.value.data["earlier_outcome"] == "outcome_unknown"
    assert isinstance(await reserve(store, b, ExecutionId("e-reserved")), Readmitted)
    # The zombie cannot complete what recovery declared unknown.
    with pytest.raises(StaleEpoch):
        await store.record_outcome(
            AGENT, ExecutionId("e-invoking"), ExecutionState.COMPLETED, worker=a.worker, epoch=a.epoch
        )
    assert await store.recover_worker("gen", new_worker=b.worker, new_epoch=b.epoch) == []


async def test_recovery_needs_the_generation_at_that_epoch(store: Store) -> None:
    """Only the generation's current holder recovers it: a stale epoch or another generation is refused."""
    a = await new_writer(store, "w-a", "gen")
    await drive(store, a, ExecutionState.INVOKING)
    other = await new_writer(store, "w-other", "gen-other")
    with pytest.raises(Conflict):
        await store.recover_worker("gen", new_worker=other.worker, new_epoch=other.epoch)
    b = await new_writer(store, "w-b", "gen", now=later(LEASE_S))
    with pytest.raises(StaleEpoch):
        await store.recover_worker("gen", new_worker=b.worker, new_epoch=Epoch(b.epoch - 1))
    assert await state_of(store) is ExecutionState.INVOKING


# ---------------------------------------------------------------- audit chains


async def test_chain_appends_link_in_order(store: Store, writer: Writer, chain: EvidenceSessionId) -> None:
    """Each append is given the head and becomes it; read_chain returns the links in order, intact."""
    for n in range(5):
        entry = await store.append_entry(
            chain, builder(chain, detail={"n": n, "text": "é"}), worker=writer.worker, epoch=writer.epoch
        )
        assert entry.seq == n + 1
    entries = await store.read_chain(chain)
    assert_linked(entries)
    assert [e.detail for e in entries[1:]] == [{"n": n, "text": "é"} for n in range(5)]
    info = await store.get_chain(chain)
    assert info is not None
    assert (info.agent, info.root, info.head_seq, info.head_hash, info.generation, info.closed) == (
        "agent-1", entries[0].hash, 5, entries[-1].hash, writer.generation, False,
    )  # fmt: skip


async def test_find_entries_reaches_every_chain_of_one_agent_and_execution(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """find_entries returns an (agent, execution_id)'s entries from every chain, by time; other keys never."""
    other = EvidenceSessionId("ev_other")
    await store.open_chain(other, genesis(other), worker=writer.worker, epoch=writer.epoch)
    w = {"worker": writer.worker, "epoch": writer.epoch}
    await store.append_entry(chain, builder(chain, execution_id="x", ts="2026-05-01T12:00:02.000000Z"), **w)
    await store.append_entry(other, builder(other, execution_id="x", ts="2026-05-01T12:00:01.000000Z"), **w)
    await store.append_entry(other, builder(other, execution_id="x", agent="agent-2"), **w)
    await store.append_entry(chain, builder(chain, execution_id="y"), **w)
    await store.append_entry(chain, builder(chain), **w)
    found = await store.find_entries(ExecutionId("x"), agent=AGENT)
    assert [(e.session_id, e.seq) for e in found] == [(other, 1), (chain, 1)]
    assert {e.agent for e in await store.find_entries(ExecutionId("x"))} == {"agent-1", "agent-2"}
    assert len(await store.find_entries(ExecutionId("x"), limit=1)) == 1
    assert await store.find_entries(ExecutionId("nobody")) == []


async def test_read_chain_pages(store: Store, writer: Writer, chain: EvidenceSessionId) -> None:
    """start_seq and limit page through a chain."""
    for _ in range(6):
        await store.append_entry(chain, builder(chain), worker=writer.worker, epoch=writer.epoch)
    assert [e.seq for e in await store.read_chain(chain, start_seq=2, limit=3)] == [2, 3, 4]
    assert [e.seq for e in await store.read_chain(chain, start_seq=5)] == [5, 6]
    assert await store.read_chain(EvidenceSessionId("ev_unknown")) == []


async def test_open_chain_refusals(store: Store, writer: Writer, chain: EvidenceSessionId) -> None:
    """A chain opens once, from a sealed genesis of its own session at seq 0."""
    with pytest.raises(Conflict):
        await store.open_chain(chain, genesis(chain), worker=writer.worker, epoch=writer.epoch)
    bad = {
        "unsealed": AuditEntry(**{**genesis("ev_x").to_json(), "hash": None}),
        "wrong_session": genesis("ev_other"),
        "not_first": make_entry("ev_x", 1, GENESIS_PREV),
    }
    for entry in bad.values():
        with pytest.raises(ValueError):
            await store.open_chain(EvidenceSessionId("ev_x"), entry, worker=writer.worker, epoch=writer.epoch)
    assert await store.get_chain(EvidenceSessionId("ev_x")) is None


async def test_append_refuses_a_wrong_link_and_writes_nothing(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """A built entry that is not the next link, or a builder that raises, leaves the chain as it was."""

    def forked(seq: int, prev: str) -> AuditEntry:
        return make_entry(chain, seq, GENESIS_PREV)

    def gapped(seq: int, prev: str) -> AuditEntry:
        return make_entry(chain, seq + 1, prev)

    def failing(seq: int, prev: str) -> AuditEntry:
        raise RuntimeError("builder failed")

    for build in (forked, gapped):
        with pytest.raises(ValueError):
            await store.append_entry(chain, build, worker=writer.worker, epoch=writer.epoch)
    with pytest.raises(RuntimeError):
        await store.append_entry(chain, failing, worker=writer.worker, epoch=writer.epoch)
    assert [e.seq for e in await store.read_chain(chain)] == [0]
    info = await store.get_chain(chain)
    assert info is not None and info.head_seq == 0


async def test_append_to_unknown_or_closed_chain_is_a_conflict(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """Appends need an open chain; a closed chain stays closed."""
    with pytest.raises(Conflict):
        await store.append_entry(
            EvidenceSessionId("ev_none"), builder("ev_none"), worker=writer.worker, epoch=1
        )
    closed = await store.close_chain(chain, worker=writer.worker, epoch=writer.epoch)
    assert closed.closed and closed.head_seq == 0
    with pytest.raises(Conflict):
        await store.append_entry(chain, builder(chain), worker=writer.worker, epoch=writer.epoch)
    with pytest.raises(Conflict):
        await store.close_chain(chain, worker=writer.worker, epoch=writer.epoch)
    with pytest.raises(Conflict):
        await store.close_chain(EvidenceSessionId("ev_none"), worker=writer.worker, epoch=writer.epoch)


async def test_close_with_a_final_entry_is_atomic(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """close_chain(final=...) appends the close entry and closes in one step; a bad final does neither."""

    def broken(seq: int, prev: str) -> AuditEntry:
        return make_entry(chain, seq + 1, prev, event="session_close")

    with pytest.raises(ValueError):
        await store.close_chain(chain, worker=writer.worker, epoch=writer.epoch, final=broken)
    info = await store.get_chain(chain)
    assert info is not None and not info.closed and info.head_seq == 0

    closed = await store.close_chain(
        chain, worker=writer.worker, epoch=writer.epoch, final=builder(chain, event="session_close")
    )
    entries = await store.read_chain(chain)
    assert_linked(entries)
    assert [e.event for e in entries] == ["session_open", "session_close"]
    assert (closed.closed, closed.head_seq, closed.head_hash) == (True, 1, entries[-1].hash)


async def test_open_chains_are_listed_for_recovery(store: Store, writer: Writer) -> None:
    """list_open_chains lists unclosed chains, optionally those one generation opened."""
    other = await new_writer(store, "w-other", "gen-other")
    for name, w in (("ev_a", writer), ("ev_b", writer), ("ev_c", other)):
        await store.open_chain(EvidenceSessionId(name), genesis(name), worker=w.worker, epoch=w.epoch)
    await store.close_chain(EvidenceSessionId("ev_b"), worker=writer.worker, epoch=writer.epoch)
    assert [c.session_id for c in await store.list_open_chains()] == ["ev_a", "ev_c"]
    assert [c.session_id for c in await store.list_open_chains(generation=writer.generation)] == ["ev_a"]


async def test_claims_are_stored_once_for_closed_chains(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """A claim needs a closed chain, is stored once, and reads back equal."""
    claim = {"session_id": chain, "entries": 1, "nested": {"k": [1, "é", None]}}
    with pytest.raises(Conflict):
        await store.store_claim(chain, claim, worker=writer.worker, epoch=writer.epoch)
    with pytest.raises(Conflict):
        await store.store_claim(EvidenceSessionId("ev_none"), claim, worker=writer.worker, epoch=writer.epoch)
    await store.close_chain(chain, worker=writer.worker, epoch=writer.epoch)
    await store.store_claim(chain, claim, worker=writer.worker, epoch=writer.epoch)
    with pytest.raises(Conflict):
        await store.store_claim(chain, {"other": True}, worker=writer.worker, epoch=writer.epoch)
    assert await store.get_claim(chain) == claim
    assert await store.get_claim(EvidenceSessionId("ev_none")) is None


async def test_a_closed_store_refuses_calls(store: Store, writer: Writer) -> None:
    """After aclose, reads and writes raise StoreError instead of touching a closed file."""
    await store.aclose()
    with pytest.raises(StoreError):
        await store.get_execution(AGENT, EID)
    with pytest.raises(StoreError):
        await reserve(store, writer)
    await store.aclose()
