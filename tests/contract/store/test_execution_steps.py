"""An execution transition and its audit entries in one write (``ExecutionStep``), on both engines."""

from __future__ import annotations

import hashlib

import pytest
from store_support import AGENT, EID, Writer, assert_linked, builder, genesis, new_writer

from bastion.admission.states import ExecutionState
from bastion.errors import Conflict, ExecutionReplay, StaleEpoch
from bastion.ids import CallId, EvidenceSessionId
from bastion.store.base import ExecutionStep, Store

pytestmark = pytest.mark.anyio

BINDING = hashlib.sha256(b"binding-0").hexdigest()


async def _invoking(store: Store, w: Writer) -> None:
    await store.reserve_execution(AGENT, EID, BINDING, call_id=CallId("c1"), worker=w.worker, epoch=w.epoch)
    await store.mark_invoking(AGENT, EID, worker=w.worker, epoch=w.epoch)


async def _state(store: Store) -> ExecutionState | None:
    record = await store.get_execution(AGENT, EID)
    return None if record is None else record.state


async def test_outcome_and_its_entry_land_together(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """A terminal step written with its entry moves the row and appends the entry in one write."""
    await _invoking(store, writer)
    step = ExecutionStep(AGENT, EID, ExecutionState.COMPLETED)
    entries = await store.append_entries(
        chain, [builder(chain, event="completed")], worker=writer.worker, epoch=writer.epoch, step=step
    )
    assert [e.seq for e in entries] == [1]
    assert await _state(store) is ExecutionState.COMPLETED
    assert_linked(await store.read_chain(chain))


async def test_a_refused_step_writes_no_entry(store: Store, writer: Writer, chain: EvidenceSessionId) -> None:
    """An illegal transition (reserved → completed) raises and leaves the chain as it was."""
    await store.reserve_execution(
        AGENT, EID, BINDING, call_id=CallId("c1"), worker=writer.worker, epoch=writer.epoch
    )
    step = ExecutionStep(AGENT, EID, ExecutionState.COMPLETED)
    with pytest.raises(Conflict):
        await store.append_entries(
            chain, [builder(chain)], worker=writer.worker, epoch=writer.epoch, step=step
        )
    assert [e.seq for e in await store.read_chain(chain)] == [0]
    assert await _state(store) is ExecutionState.RESERVED


async def test_a_failing_append_leaves_the_row_unmoved(store: Store, writer: Writer) -> None:
    """An append refused (unknown chain) takes the transition back with it: the row stays invoking."""
    await _invoking(store, writer)
    step = ExecutionStep(AGENT, EID, ExecutionState.COMPLETED)
    missing = EvidenceSessionId("ev_missing")
    with pytest.raises(Conflict):
        await store.append_entries(
            missing, [builder(missing)], worker=writer.worker, epoch=writer.epoch, step=step
        )
    assert await _state(store) is ExecutionState.INVOKING


async def test_reserving_step_admits_and_marks_invoking_or_refuses_a_replay(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """A step that reserves first goes none → invoking with its entries; a terminal row is a replay."""
    admit = ExecutionStep(AGENT, EID, ExecutionState.INVOKING, reserve_binding=BINDING, call_id=CallId("c1"))
    await store.append_entries(
        chain, [builder(chain), builder(chain)], worker=writer.worker, epoch=writer.epoch, step=admit
    )
    assert await _state(store) is ExecutionState.INVOKING
    await store.record_outcome(AGENT, EID, ExecutionState.FAILED, worker=writer.worker, epoch=writer.epoch)
    again = ExecutionStep(AGENT, EID, ExecutionState.INVOKING, reserve_binding=BINDING, call_id=CallId("c2"))
    with pytest.raises(ExecutionReplay):
        await store.append_entries(
            chain, [builder(chain)], worker=writer.worker, epoch=writer.epoch, step=again
        )
    assert [e.seq for e in await store.read_chain(chain)] == [0, 1, 2]


async def test_a_step_opens_a_chain_with_it(store: Store, writer: Writer) -> None:
    """``open_chain`` with a step writes the chain and the transition together."""
    await _invoking(store, writer)
    session_id = EvidenceSessionId("ev_opened")
    step = ExecutionStep(AGENT, EID, ExecutionState.OUTCOME_UNKNOWN)
    await store.open_chain(
        session_id, genesis(session_id), worker=writer.worker, epoch=writer.epoch, step=step
    )
    assert await _state(store) is ExecutionState.OUTCOME_UNKNOWN
    assert await store.get_chain(session_id) is not None


async def test_a_stale_writer_moves_nothing(store: Store, writer: Writer, chain: EvidenceSessionId) -> None:
    """A writer not holding its generation at that epoch is refused, step and entries: nothing changes."""
    await _invoking(store, writer)
    stale = await new_writer(store, "gw-b-20260501T120000Z-abc1234", "gateway-1")
    step = ExecutionStep(AGENT, EID, ExecutionState.COMPLETED)
    with pytest.raises(StaleEpoch):
        await store.append_entries(
            chain, [builder(chain)], worker=stale.worker, epoch=stale.epoch + 1, step=step
        )
    assert await _state(store) is ExecutionState.INVOKING
    assert [e.seq for e in await store.read_chain(chain)] == [0]


def test_a_step_names_a_forward_target() -> None:
    """A step never moves a row back to reserved or released, and a reserving step names its call."""
    with pytest.raises(ValueError):
        ExecutionStep(AGENT, EID, ExecutionState.RELEASED)
    with pytest.raises(ValueError):
        ExecutionStep(AGENT, EID, ExecutionState.COMPLETED, reserve_binding=BINDING, call_id=CallId("c"))
    with pytest.raises(ValueError):
        ExecutionStep(AGENT, EID, ExecutionState.INVOKING, reserve_binding=BINDING)


async def test_a_reserving_step_readmits_a_released_row(
    store: Store, writer: Writer, chain: EvidenceSessionId
) -> None:
    """A released row with the same binding is admitted again by a reserving step, straight to invoking."""
    await store.reserve_execution(
        AGENT, EID, BINDING, call_id=CallId("c1"), worker=writer.worker, epoch=writer.epoch
    )
    await store.release_execution(AGENT, EID, worker=writer.worker, epoch=writer.epoch)
    admit = ExecutionStep(AGENT, EID, ExecutionState.INVOKING, reserve_binding=BINDING, call_id=CallId("c2"))
    await store.append_entries(chain, [builder(chain)], worker=writer.worker, epoch=writer.epoch, step=admit)
    record = await store.get_execution(AGENT, EID)
    assert record is not None
    assert (record.state, record.call_id) == (ExecutionState.INVOKING, "c2")
