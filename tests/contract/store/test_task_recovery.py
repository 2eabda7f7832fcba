"""Recovery and a live task (issue 24, DESIGN section 3), on every engine.

An execution left ``invoking`` whose task is still live in the store is its
task's: recovery leaves it ``invoking`` (under the new holder) and names the
task, takeover does not count it as unsettled, and whichever replica sees the
task terminal settles it, whatever generation created it.
"""

from __future__ import annotations

import pytest
from store_support import AGENT, LEASE_S, NOW, Writer, later, new_writer

from bastion.admission.states import ExecutionState
from bastion.errors import Conflict
from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId
from bastion.store.base import Store
from bastion.store.tasks import NewTask, TaskRecord, TaskStatus

pytestmark = pytest.mark.anyio

BOB = AgentId("agent-bob")


async def invoking(store: Store, w: Writer, execution: str) -> ExecutionId:
    eid = ExecutionId(execution)
    await store.reserve_execution(
        AGENT, eid, "b" * 64, call_id=CallId("call-" + execution), worker=w.worker, epoch=w.epoch
    )
    await store.mark_invoking(AGENT, eid, worker=w.worker, epoch=w.epoch)
    return eid


async def task_of(
    store: Store, execution: str, status: TaskStatus = TaskStatus.WORKING, *, agent: AgentId = AGENT
) -> TaskRecord:
    """A task of ``agent``'s execution, on a static token (no agent session)."""
    return await store.create_task(
        NewTask(
            agent, None, "tasks", f"up-{agent}-{execution}", CallId("call-" + execution),
            EvidenceSessionId("ev_1"), ExecutionId(execution), status,
        ),
        now=NOW,
    )  # fmt: skip


async def test_recovery_leaves_an_execution_whose_task_is_live_to_its_task(store: Store) -> None:
    """A live task keeps its execution invoking under the new holder; a finished or absent one does not."""
    a = await new_writer(store, "w-a", "gen")
    live = await task_of(store, "e-live")
    await invoking(store, a, "e-live")
    asking = await task_of(store, "e-input", TaskStatus.INPUT_REQUIRED)
    await invoking(store, a, "e-input")
    # Its task ended but the poll that saw it died before settling the execution: nothing to wait on.
    await task_of(store, "e-ended", TaskStatus.COMPLETED)
    await invoking(store, a, "e-ended")
    await invoking(store, a, "e-plain")
    await task_of(store, "e-plain", agent=BOB)  # the same execution id of another agent is not its task
    assert (await store.generation_backlog("gen")).unsettled_executions == 2
    b = await new_writer(store, "w-b", "gen", now=later(LEASE_S))

    recovered = await store.recover_worker("gen", new_worker=b.worker, new_epoch=b.epoch)

    assert [(r.execution_id, r.previous_state, r.state, r.task_id) for r in recovered] == [
        ("e-ended", ExecutionState.INVOKING, ExecutionState.OUTCOME_UNKNOWN, None),
        ("e-input", ExecutionState.INVOKING, ExecutionState.INVOKING, asking.task_id),
        ("e-live", ExecutionState.INVOKING, ExecutionState.INVOKING, live.task_id),
        ("e-plain", ExecutionState.INVOKING, ExecutionState.OUTCOME_UNKNOWN, None),
    ]
    assert all((r.previous_worker, r.previous_epoch) == ("w-a", 1) for r in recovered)
    record = await store.get_execution(AGENT, ExecutionId("e-live"))
    assert record is not None and (record.state, record.worker, record.epoch) == ("invoking", "w-b", 2)
    # Nothing left for a takeover to do: the live tasks' executions are theirs to settle.
    assert (await store.generation_backlog("gen")).unsettled_executions == 0
    assert await store.recover_worker("gen", new_worker=b.worker, new_epoch=b.epoch) == []
    # The next poll that sees the task terminal settles the execution, as it would have.
    await store.set_task_status(
        live.task_id, TaskStatus.COMPLETED, agent=AGENT, agent_session_id=None, now=NOW
    )
    done = await store.record_outcome(
        AGENT, ExecutionId("e-live"), ExecutionState.COMPLETED, worker=b.worker, epoch=b.epoch
    )
    assert done.state is ExecutionState.COMPLETED


async def test_a_terminal_task_settles_its_execution_at_any_generation(store: Store) -> None:
    """Another generation may settle an execution only once its task is terminal in the store."""
    a = await new_writer(store, "w-a", "gen-a")
    other = await new_writer(store, "w-other", "gen-b")
    task = await task_of(store, "e-task")
    eid = await invoking(store, a, "e-task")
    plain = await invoking(store, a, "e-plain")

    with pytest.raises(Conflict):  # the task still runs: nothing to settle it with
        await store.record_outcome(
            AGENT, eid, ExecutionState.COMPLETED, worker=other.worker, epoch=other.epoch
        )
    await store.set_task_status(
        task.task_id, TaskStatus.COMPLETED, agent=AGENT, agent_session_id=None, now=NOW
    )
    with pytest.raises(Conflict):  # not what a completed task settles it to
        await store.record_outcome(AGENT, eid, ExecutionState.FAILED, worker=other.worker, epoch=other.epoch)
    settled = await store.record_outcome(
        AGENT, eid, ExecutionState.COMPLETED, worker=other.worker, epoch=other.epoch
    )
    assert (settled.state, settled.worker, settled.generation) == ("completed", "w-other", "gen-a")
    with pytest.raises(Conflict):  # a call without a task is its own generation's alone
        await store.record_outcome(
            AGENT, plain, ExecutionState.COMPLETED, worker=other.worker, epoch=other.epoch
        )
