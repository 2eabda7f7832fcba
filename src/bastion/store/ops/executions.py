"""Operations on execution rows: reservation with its binding, state transitions, recovery.

Each runs in one transaction after :func:`~bastion.store.ops.workers.fence`;
the row is read ``FOR UPDATE`` or changed by one conditional ``UPDATE``
(PostgreSQL row locks), so two transitions of one row never interleave. Two
replicas inserting one new row meet on its primary key: ``ON CONFLICT DO
NOTHING`` makes the loser wait for the winner's commit and then read and
classify the winner's row (in flight, collision) like any other.
"""

from __future__ import annotations

from dataclasses import replace

from bastion.admission.states import TRANSITIONS, ExecutionState, check_transition
from bastion.errors import Conflict, ExecutionCollision, ExecutionInFlight, ExecutionReplay
from bastion.ids import AgentId, CallId, Epoch, ExecutionId, WorkerId
from bastion.store.base import (
    ExecutionRecord,
    ExecutionStep,
    Readmitted,
    RecoveredExecution,
    Reserved,
    ReserveOutcome,
)
from bastion.store.ops.workers import fence
from bastion.store.rows import SELECT_EXECUTION, execution_from_row
from bastion.store.statements import Op, count, execute, one, rows

_UPDATE_STATE = "UPDATE executions SET state = ?, worker = ?, epoch = ? WHERE agent = ? AND execution_id = ?"
_INSERT_EXECUTION = (
    "INSERT INTO executions (agent, execution_id, binding, state, call_id, generation, worker, epoch)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def select_execution(
    agent: AgentId, execution_id: ExecutionId, *, lock: bool = False
) -> Op[ExecutionRecord | None]:
    row = yield from one(SELECT_EXECUTION, agent, execution_id, lock="FOR UPDATE" if lock else "")
    return None if row is None else execution_from_row(row)


def reserve_execution(
    agent: AgentId, execution_id: ExecutionId, binding: str, call_id: CallId, worker: WorkerId, epoch: Epoch
) -> Op[ReserveOutcome]:
    generation = yield from fence(worker, epoch)
    return (yield from reserve_fenced(agent, execution_id, binding, call_id, generation, worker, epoch))


def reserve_fenced(
    agent: AgentId,
    execution_id: ExecutionId,
    binding: str,
    call_id: CallId,
    generation: str,
    worker: WorkerId,
    epoch: Epoch,
    *,
    then: ExecutionState = ExecutionState.RESERVED,
) -> Op[ReserveOutcome]:
    """:func:`reserve_execution` for a writer already fenced (as ``generation``) in this transaction.

    ``then``: the state the reserved row moves on to in the same statement (``invoking``),
    as though reserved first and then moved: one statement, never a visible ``reserved``.
    """
    if then is not ExecutionState.RESERVED:
        check_transition(ExecutionState.RESERVED, then)
    state = then
    check_transition(None, ExecutionState.RESERVED)
    values = (agent, execution_id, binding, state.value, call_id, generation, worker, epoch)
    # The common case in one statement: a new key is inserted; a known one is left alone and read.
    if (yield from count(_INSERT_EXECUTION + " ON CONFLICT (agent, execution_id) DO NOTHING", *values)) == 1:
        return Reserved(
            ExecutionRecord(agent, execution_id, binding, state, call_id, generation, worker, epoch)
        )
    row = yield from select_execution(agent, execution_id, lock=True)
    if row is None:
        # Gone between the two statements (no engine deletes rows today): insert it, or raise.
        yield from execute(_INSERT_EXECUTION, *values)
        return Reserved(
            ExecutionRecord(agent, execution_id, binding, state, call_id, generation, worker, epoch)
        )
    if row.binding != binding:
        raise ExecutionCollision(execution_id=execution_id)
    if row.state.is_terminal:
        raise ExecutionReplay(
            execution_id=execution_id, earlier_outcome=row.state.value, earlier_call_id=row.call_id
        )
    if row.state is not ExecutionState.RELEASED:
        raise ExecutionInFlight(execution_id=execution_id, state=row.state.value)
    check_transition(row.state, ExecutionState.RESERVED)
    yield from execute(
        "UPDATE executions SET state = ?, call_id = ?, generation = ?, worker = ?, epoch = ?"
        " WHERE agent = ? AND execution_id = ?",
        state.value, call_id, generation, worker, epoch, agent, execution_id,
    )  # fmt: skip
    # The row as written, without reading it back: one statement less per reservation.
    return Readmitted(
        replace(
            row,
            state=state,
            call_id=call_id,
            generation=generation,
            worker=worker,
            epoch=epoch,
        )
    )


def transition(
    agent: AgentId, execution_id: ExecutionId, target: ExecutionState, worker: WorkerId, epoch: Epoch
) -> Op[ExecutionRecord]:
    generation = yield from fence(worker, epoch)
    return (yield from _move(agent, execution_id, target, generation, worker, epoch))


def _move(
    agent: AgentId,
    execution_id: ExecutionId,
    target: ExecutionState,
    generation: str,
    worker: WorkerId,
    epoch: Epoch,
) -> Op[ExecutionRecord]:
    """Move this generation's row to ``target`` along an edge of the table, or raise why not.

    The common case is one statement: an ``UPDATE`` that matches only a row of this generation
    in the one state with an edge to ``target``. When it matches nothing, the row is read and
    the precise refusal raised (or, had it changed in between, moved after all).
    """
    source = _ONLY_SOURCE.get(target)
    if source is not None:
        written = yield from rows(
            "UPDATE executions SET state = ?, worker = ?, epoch = ?"
            " WHERE agent = ? AND execution_id = ? AND generation = ? AND state = ?"
            " RETURNING agent, execution_id, binding, state, call_id, generation, worker, epoch",
            target.value, worker, epoch, agent, execution_id, generation, source,
        )  # fmt: skip
        if written:
            return execution_from_row(written[0])
    row = yield from select_execution(agent, execution_id, lock=True)
    if row is None:
        raise Conflict("no such execution", execution_id=execution_id)
    if row.generation != generation and not (yield from _settled_by_its_task(agent, execution_id, target)):
        raise Conflict("the execution belongs to another generation", execution_id=execution_id)
    check_transition(row.state, target)
    yield from execute(_UPDATE_STATE, target.value, worker, epoch, agent, execution_id)
    return replace(row, state=target, worker=worker, epoch=epoch)


def apply_step(step: ExecutionStep, generation: str, worker: WorkerId, epoch: Epoch) -> Op[ExecutionRecord]:
    """Make ``step`` (reserving first when it says so) for a writer fenced as ``generation``."""
    if step.reserve_binding is not None:
        assert step.call_id is not None
        reserved = yield from reserve_fenced(
            step.agent,
            step.execution_id,
            step.reserve_binding,
            step.call_id,
            generation,
            worker,
            epoch,
            then=step.target,
        )
        return reserved.record
    return (yield from _move(step.agent, step.execution_id, step.target, generation, worker, epoch))


#: The one state with an edge to each target that has exactly one (``admission/states.py``).
_ONLY_SOURCE: dict[ExecutionState, str] = {
    target: sources[0]
    for target in ExecutionState
    if len(sources := [s.value for s, ts in TRANSITIONS.items() if s is not None and target in ts]) == 1
}


#: The task statuses that settle an execution to each terminal state (``tasks/relay.py``: a
#: cancelled task, or a failed one its upstream lost, leaves its outcome unknown).
_SETTLED_BY: dict[ExecutionState, str] = {
    ExecutionState.COMPLETED: (
        "SELECT 1 FROM tasks WHERE agent = ? AND execution_id = ? AND status = 'completed'"
    ),
    ExecutionState.FAILED: "SELECT 1 FROM tasks WHERE agent = ? AND execution_id = ? AND status = 'failed'",
    ExecutionState.OUTCOME_UNKNOWN: (
        "SELECT 1 FROM tasks WHERE agent = ? AND execution_id = ? AND status IN ('failed', 'cancelled')"
    ),
}


def _settled_by_its_task(agent: AgentId, execution_id: ExecutionId, target: ExecutionState) -> Op[bool]:
    """Whether the execution's task is terminal in the store with a status that settles it to ``target``.

    Any replica that sees a task terminal settles its execution (``tasks/relay.py``), whichever
    generation created it: the first terminal status recorded in the store is the fact it writes.
    """
    query = _SETTLED_BY.get(target)
    return query is not None and (yield from one(query, agent, execution_id)) is not None


def recover_worker(generation: str, new_worker: WorkerId, new_epoch: Epoch) -> Op[list[RecoveredExecution]]:
    if (yield from fence(new_worker, new_epoch)) != generation:
        raise Conflict("the recovering worker does not hold that generation")
    found = yield from rows(
        # With the execution's task while it is live in the store (working, input_required).
        "SELECT agent, execution_id, binding, state, call_id, worker, epoch,"
        " (SELECT task_id FROM tasks WHERE tasks.agent = executions.agent"
        " AND tasks.execution_id = executions.execution_id AND tasks.status IN ('working', 'input_required'))"
        " FROM executions WHERE generation = ? AND state IN ('reserved', 'invoking') AND epoch < ?"
        " ORDER BY agent, execution_id",
        generation,
        new_epoch,
        lock="FOR UPDATE OF executions",
    )
    recovered = []
    for agent, execution_id, binding, state, call_id, worker, epoch, task_id in found:
        previous = ExecutionState(state)
        target = (
            ExecutionState.OUTCOME_UNKNOWN if previous is ExecutionState.INVOKING else ExecutionState.RELEASED
        )
        if previous is ExecutionState.INVOKING and task_id is not None:
            target = previous  # left to its task, held now by the new worker (no transition)
        else:
            check_transition(previous, target)
        yield from execute(_UPDATE_STATE, target.value, new_worker, new_epoch, agent, execution_id)
        recovered.append(
            RecoveredExecution(
                AgentId(agent), ExecutionId(execution_id), binding, call_id,
                previous, target, WorkerId(worker), Epoch(epoch), task_id,
            )
        )  # fmt: skip
    return recovered
