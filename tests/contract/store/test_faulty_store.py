"""FaultyStore (STYLE "Boundaries"): injected NotDurable before or after commit, then pass-through.

Also the terminal-persistence rule of seed 000: when the terminal transition is
not durable, the row stays non-terminal and so stays refused.
"""

from __future__ import annotations

import pytest
from store_support import AGENT, EID, Writer, builder

from bastion.admission.states import ExecutionState
from bastion.errors import ExecutionInFlight, ExecutionReplay, NotDurable
from bastion.ids import CallId, EvidenceSessionId
from bastion.store.base import Store
from tests.support.faulty_store import FaultyStore

pytestmark = pytest.mark.anyio

BINDING = "cd" * 32


async def invoking(store: Store, w: Writer) -> None:
    await store.reserve_execution(AGENT, EID, BINDING, call_id=CallId("c1"), worker=w.worker, epoch=w.epoch)
    await store.mark_invoking(AGENT, EID, worker=w.worker, epoch=w.epoch)


async def complete(store: Store, w: Writer) -> object:
    return await store.record_outcome(AGENT, EID, ExecutionState.COMPLETED, worker=w.worker, epoch=w.epoch)


async def retry(store: Store, w: Writer) -> object:
    return await store.reserve_execution(
        AGENT, EID, BINDING, call_id=CallId("c2"), worker=w.worker, epoch=w.epoch
    )


async def state(store: Store) -> ExecutionState | None:
    record = await store.get_execution(AGENT, EID)
    return None if record is None else record.state


async def test_before_commit_writes_nothing_and_the_row_stays_refused(store: Store, writer: Writer) -> None:
    """A terminal write lost before commit leaves the row invoking: a retry is in flight, not a replay."""
    faulty = FaultyStore(store, fail_at="record_outcome", when="before_commit")
    await invoking(faulty, writer)
    with pytest.raises(NotDurable) as caught:
        await complete(faulty, writer)
    assert caught.value.data == {"fail_point": "record_outcome"}
    assert await state(store) is ExecutionState.INVOKING
    with pytest.raises(ExecutionInFlight):
        await retry(faulty, writer)
    # times=1: the next call passes through.
    await complete(faulty, writer)
    with pytest.raises(ExecutionReplay):
        await retry(faulty, writer)
    assert faulty.injected == 1 and not faulty.armed


async def test_after_commit_writes_but_reports_failure(store: Store, writer: Writer) -> None:
    """A lost acknowledgement: the caller hears NotDurable, the terminal state is durable anyway."""
    faulty = FaultyStore(store, fail_at="record_outcome", when="after_commit")
    await invoking(faulty, writer)
    with pytest.raises(NotDurable):
        await complete(faulty, writer)
    assert await state(store) is ExecutionState.COMPLETED
    with pytest.raises(ExecutionReplay):
        await retry(faulty, writer)


async def test_fails_until_recovered(store: Store, writer: Writer, chain: EvidenceSessionId) -> None:
    """times=None keeps failing until recover(); fail_again() re-arms; reads always pass through."""
    faulty = FaultyStore(store, fail_at="append_entry", when="before_commit", times=None)
    for _ in range(3):
        with pytest.raises(NotDurable):
            await faulty.append_entry(chain, builder(chain), worker=writer.worker, epoch=writer.epoch)
    assert [e.seq for e in await faulty.read_chain(chain)] == [0]
    faulty.recover()
    await faulty.append_entry(chain, builder(chain), worker=writer.worker, epoch=writer.epoch)
    faulty.fail_again(1)
    with pytest.raises(NotDurable):
        await faulty.append_entry(chain, builder(chain), worker=writer.worker, epoch=writer.epoch)
    assert [e.seq for e in await faulty.read_chain(chain)] == [0, 1]
    assert faulty.injected == 4


async def test_other_operations_pass_through(store: Store, writer: Writer) -> None:
    """Only the named fail point fails."""
    faulty = FaultyStore(store, fail_at="release_execution", times=None)
    await invoking(faulty, writer)
    await complete(faulty, writer)
    assert await state(faulty) is ExecutionState.COMPLETED
    assert faulty.injected == 0


def test_unknown_fail_point_is_refused(store: Store) -> None:
    """A misspelt or read-only fail point is a test bug, refused at construction."""
    for name in ("record_outcomes", "get_execution"):
        with pytest.raises(ValueError):
            FaultyStore(store, fail_at=name)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FaultyStore(store, when="during_commit")  # type: ignore[arg-type]
