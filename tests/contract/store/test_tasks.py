"""Tasks and their owners in the store (issue 24), on every engine and across replicas.

An unknown task id and another owner's give one answer (``None``); a revoked
agent session is refused whatever the id; an execution creates one task; the
first terminal status wins; any replica reads what another wrote.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import anyio
import pytest
from store_support import NOW, later

from bastion.errors import AgentSessionExpired, AgentSessionRevoked, Conflict
from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId
from bastion.store.base import Store
from bastion.store.tasks import NewTask, TaskRecord, TaskStatus
from tests.support.faulty_store import FaultyStore

pytestmark = pytest.mark.anyio

ADA, BOB = AgentId("agent-ada"), AgentId("agent-bob")
TTL = timedelta(hours=1)


async def agent_session(store: Store, agent: AgentId = ADA, *, now: datetime = NOW) -> str:
    record = await store.create_agent_session(
        human="ada@example.org", agent=agent, team=None, scopes=frozenset(), now=now, expires_at=now + TTL
    )
    return record.agent_session_id


async def new_task(
    store: Store,
    owner: str | None,
    *,
    agent: AgentId = ADA,
    upstream: str = "up-1",
    execution: str | None = "exec-1",
    now: datetime = NOW,
) -> TaskRecord:
    return await store.create_task(
        NewTask(
            agent, owner, "tasks", upstream, CallId("call-1"), EvidenceSessionId("ev_1"),
            None if execution is None else ExecutionId(execution),
        ),
        now=now,
    )  # fmt: skip


async def test_a_task_is_recorded_under_a_fresh_id_that_names_nothing_of_the_upstream(store: Store) -> None:
    owner = await agent_session(store)
    task = await new_task(store, owner)
    assert task.task_id.startswith("task_") and len(task.task_id) == len("task_") + 32
    assert "up-1" not in task.task_id and owner not in task.task_id
    assert (task.agent, task.agent_session_id, task.server, task.upstream_task_id) == (
        ADA,
        owner,
        "tasks",
        "up-1",
    )
    assert (task.call_id, task.evidence_session_id, task.execution_id) == ("call-1", "ev_1", "exec-1")
    assert task.status is TaskStatus.WORKING and not task.terminal
    assert await store.get_task(task.task_id, agent=ADA, agent_session_id=owner, now=NOW) == task
    other = await new_task(store, owner, upstream="up-2", execution="exec-2")
    assert other.task_id != task.task_id


async def test_another_owners_task_answers_as_an_unknown_id(store: Store) -> None:
    ada, ada_again, bob = (
        await agent_session(store),
        await agent_session(store),
        await agent_session(store, BOB),
    )
    task = await new_task(store, ada)
    for agent, owner in ((BOB, bob), (BOB, ada), (ADA, ada_again), (ADA, None)):
        assert await store.get_task(task.task_id, agent=agent, agent_session_id=owner, now=NOW) is None
        assert await store.get_task("task_" + "0" * 32, agent=agent, agent_session_id=owner, now=NOW) is None
        assert (
            await store.set_task_status(
                task.task_id, TaskStatus.CANCELLED, agent=agent, agent_session_id=owner, now=NOW
            )
            is None
        )
        assert await store.list_tasks(agent=agent, agent_session_id=owner, now=NOW) == []
        assert await store.list_tasks(agent=agent, agent_session_id=owner, now=NOW, after=task.task_id) == []
    # Nothing was steered by the others.
    assert await store.get_task(task.task_id, agent=ADA, agent_session_id=ada, now=NOW) == task


async def test_a_revoked_or_expired_agent_session_can_no_longer_read_or_steer_its_tasks(store: Store) -> None:
    owner = await agent_session(store)
    task = await new_task(store, owner)
    with pytest.raises(AgentSessionExpired):
        await store.get_task(task.task_id, agent=ADA, agent_session_id=owner, now=NOW + TTL)
    await store.revoke_agent_session(owner, by="admin", reason="test", now=later(1))
    for task_id in (task.task_id, "task_unknown"):
        with pytest.raises(AgentSessionRevoked):
            await store.get_task(task_id, agent=ADA, agent_session_id=owner, now=later(2))
        with pytest.raises(AgentSessionRevoked):
            await store.set_task_status(
                task_id, TaskStatus.CANCELLED, agent=ADA, agent_session_id=owner, now=later(2)
            )
    with pytest.raises(AgentSessionRevoked):
        await store.list_tasks(agent=ADA, agent_session_id=owner, now=later(2))
    with pytest.raises(AgentSessionRevoked):
        await new_task(store, owner, upstream="up-2", execution="exec-2", now=later(2))


async def test_an_execution_creates_one_task_and_an_upstream_task_is_recorded_once(store: Store) -> None:
    owner = await agent_session(store)
    first = await new_task(store, owner)
    with pytest.raises(Conflict):
        await new_task(store, owner, upstream="up-2")  # the replay of exec-1
    with pytest.raises(Conflict):
        await new_task(store, owner, execution="exec-2")  # up-1 again
    assert await store.list_tasks(agent=ADA, agent_session_id=owner, now=NOW) == [first]
    # Calls without an execution id each make their own task.
    await new_task(store, owner, upstream="up-3", execution=None)
    await new_task(store, owner, upstream="up-4", execution=None)
    assert len(await store.list_tasks(agent=ADA, agent_session_id=owner, now=NOW)) == 3


async def test_the_first_terminal_status_wins(store: Store) -> None:
    owner = await agent_session(store)
    task = await new_task(store, owner)

    async def status(value: TaskStatus, at: int) -> tuple[TaskRecord, bool] | None:
        return await store.set_task_status(
            task.task_id, value, agent=ADA, agent_session_id=owner, now=later(at)
        )

    moved = await status(TaskStatus.INPUT_REQUIRED, 1)
    assert moved is not None and moved[1] and moved[0].status is TaskStatus.INPUT_REQUIRED
    assert moved[0].updated_at == later(1) and moved[0].created_at == NOW
    same = await status(TaskStatus.INPUT_REQUIRED, 2)
    assert same is not None and not same[1] and same[0].updated_at == later(1)
    done = await status(TaskStatus.COMPLETED, 3)
    assert done is not None and done[1] and done[0].terminal
    for value in (TaskStatus.CANCELLED, TaskStatus.WORKING, TaskStatus.FAILED):
        after = await status(value, 4)
        assert after is not None and not after[1] and after[0].status is TaskStatus.COMPLETED


async def test_concurrent_terminal_statuses_have_one_winner(store: Store, replica: Store) -> None:
    owner = await agent_session(store)
    task = await new_task(store, owner)
    results: list[tuple[TaskRecord, bool] | None] = []
    start = anyio.Event()

    async def race(at: Store, value: TaskStatus) -> None:
        await start.wait()
        results.append(
            await at.set_task_status(task.task_id, value, agent=ADA, agent_session_id=owner, now=NOW)
        )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(race, store, TaskStatus.COMPLETED)
            tg.start_soon(race, replica, TaskStatus.CANCELLED)
            start.set()
    assert all(r is not None for r in results)
    winners = [r for r in results if r is not None and r[1]]
    assert len(winners) == 1
    final = await replica.get_task(task.task_id, agent=ADA, agent_session_id=owner, now=NOW)
    assert final is not None and final.status is winners[0][0].status


async def test_any_replica_serves_the_owners_tasks_in_creation_order_with_a_cursor(
    store: Store, replica: Store
) -> None:
    owner, bob = await agent_session(store), await agent_session(store, BOB)
    made = [
        await new_task(store, owner, upstream=f"up-{n}", execution=f"exec-{n}", now=later(n))
        for n in range(5)
    ]
    await new_task(store, bob, agent=BOB, upstream="bob-1", execution="exec-bob")
    assert await replica.list_tasks(agent=ADA, agent_session_id=owner, now=NOW) == made
    assert await replica.list_tasks(agent=ADA, agent_session_id=owner, now=NOW, limit=2) == made[:2]
    page = await replica.list_tasks(
        agent=ADA, agent_session_id=owner, now=NOW, after=made[1].task_id, limit=2
    )
    assert page == made[2:4]
    assert await replica.get_task(made[3].task_id, agent=ADA, agent_session_id=owner, now=NOW) == made[3]


async def test_a_static_token_agent_owns_tasks_without_an_agent_session(store: Store) -> None:
    task = await new_task(store, None)
    assert await store.get_task(task.task_id, agent=ADA, agent_session_id=None, now=NOW) == task
    assert await store.get_task(task.task_id, agent=BOB, agent_session_id=None, now=NOW) is None


def test_a_new_task_names_its_owner_server_upstream_id_call_and_chain() -> None:
    with pytest.raises(ValueError):
        NewTask(ADA, None, "tasks", "", CallId("call-1"), EvidenceSessionId("ev_1"), None)
    with pytest.raises(ValueError):
        NewTask(ADA, None, "tasks", "up-1", CallId("call-1"), EvidenceSessionId(""), None)
    with pytest.raises(ValueError):
        NewTask(ADA, None, "tasks", "up-1", CallId("c"), EvidenceSessionId("e"), None, "done")  # type: ignore[arg-type]


async def test_a_wrapping_store_passes_tasks_through(store: Store) -> None:
    owner = await agent_session(store)
    wrapped = FaultyStore(store, fail_at="append_entry")
    task = await new_task(wrapped, owner)  # type: ignore[arg-type]
    assert await wrapped.get_task(task.task_id, agent=ADA, agent_session_id=owner, now=NOW) == task
    assert await wrapped.list_tasks(agent=ADA, agent_session_id=owner, now=NOW) == [task]
    changed = await wrapped.set_task_status(
        task.task_id, TaskStatus.FAILED, agent=ADA, agent_session_id=owner, now=NOW
    )
    assert changed is not None and changed[1]


async def test_the_task_of_an_execution_is_found_by_its_owner_only(store: Store) -> None:
    """An execution's task answers its owner; another owner, or an execution without one, gets ``None``."""
    owner, bob = await agent_session(store), await agent_session(store, BOB)
    task = await new_task(store, owner)
    found = await store.task_of_execution(ExecutionId("exec-1"), agent=ADA, agent_session_id=owner, now=NOW)
    assert found == task
    for agent, session in ((BOB, bob), (ADA, None)):
        assert (
            await store.task_of_execution(
                ExecutionId("exec-1"), agent=agent, agent_session_id=session, now=NOW
            )
            is None
        )
    assert (
        await store.task_of_execution(ExecutionId("exec-2"), agent=ADA, agent_session_id=owner, now=NOW)
        is None
    )
    await store.revoke_agent_session(owner, by="admin", reason="test", now=later(1))
    with pytest.raises(AgentSessionRevoked):
        await store.task_of_execution(ExecutionId("exec-1"), agent=ADA, agent_session_id=owner, now=later(2))


async def test_one_execution_id_under_two_agents_is_two_executions_each_with_its_task(store: Store) -> None:
    """An execution id is scoped under its agent (DESIGN 3): another agent's same value makes its own task."""
    ada, bob = await agent_session(store), await agent_session(store, BOB)
    first = await new_task(store, ada)
    second = await new_task(store, bob, agent=BOB, upstream="up-2")
    assert first.execution_id == second.execution_id == "exec-1"
    assert (
        await store.task_of_execution(ExecutionId("exec-1"), agent=BOB, agent_session_id=bob, now=NOW)
        == second
    )
    with pytest.raises(Conflict):
        await new_task(store, bob, agent=BOB, upstream="up-3")  # bob's own replay of exec-1


async def test_the_task_an_upstream_id_names_is_found_by_its_owner_only(store: Store) -> None:
    """A server's upstream task id finds the owner's task; another owner, another server, or an id
    nobody recorded get ``None``; a revoked owner is refused."""
    owner, bob = await agent_session(store), await agent_session(store, BOB)
    task = await new_task(store, owner)
    assert await store.task_of_upstream("tasks", "up-1", agent=ADA, agent_session_id=owner, now=NOW) == task
    wrapped = FaultyStore(store, fail_at="append_entry")
    assert await wrapped.task_of_upstream("tasks", "up-1", agent=ADA, agent_session_id=owner, now=NOW) == task
    for server, upstream, agent, session in (
        ("tasks", "up-1", BOB, bob),
        ("tasks", "up-1", ADA, None),
        ("other", "up-1", ADA, owner),
        ("tasks", "up-2", ADA, owner),
    ):
        assert (
            await store.task_of_upstream(server, upstream, agent=agent, agent_session_id=session, now=NOW)
            is None
        )
    await store.revoke_agent_session(owner, by="admin", reason="test", now=later(1))
    with pytest.raises(AgentSessionRevoked):
        await store.task_of_upstream("tasks", "up-1", agent=ADA, agent_session_id=owner, now=later(2))


async def test_a_task_keeps_the_tool_of_the_call_that_created_it(store: Store) -> None:
    """The creating call's upstream tool is read back wherever the task is (its grants are re-checked
    on it, tasks/relay.py); a task recorded without one reads back ``None``."""
    owner = await agent_session(store)
    named = await store.create_task(
        NewTask(
            ADA, owner, "tasks", "up-t", CallId("call-t"), EvidenceSessionId("ev_1"), ExecutionId("exec-t"),
            tool="research",
        ),
        now=NOW,
    )  # fmt: skip
    assert named.tool == "research"
    assert await store.get_task(named.task_id, agent=ADA, agent_session_id=owner, now=NOW) == named
    assert (await new_task(store, owner)).tool is None
