"""Step-up approval requests in the store (issue 27), on every engine and across replicas.

A request is decided once: the first move from pending wins, whoever makes it
and at whichever replica; an approver's decision after expiry does not count;
one live request per execution, so a second attempt finds the first (its
binding included) instead of asking again; any replica reads what another wrote.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from store_support import NOW, later

from bastion.errors import Conflict
from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId
from bastion.store.approvals import ApprovalState, NewApproval
from bastion.store.base import Store
from tests.support.faulty_store import FaultyStore

pytestmark = pytest.mark.anyio

ADA = AgentId("agent-ada")
BINDING, OTHER = "a" * 64, "b" * 64


def new_request(
    *, execution: str | None = "exec-1", binding: str = BINDING, arguments: Any = None, ttl_s: float = 60
) -> NewApproval:
    return NewApproval(
        agent=ADA, agent_session_id=None, human="ada@example.org", server="tools", tool="delete",
        binding=binding, execution_id=None if execution is None else ExecutionId(execution),
        call_id=CallId("call-1"), evidence_session_id=EvidenceSessionId("ev_1"), grant="guarded",
        approvers=("alice", "bob"), arguments=arguments, expires_at=NOW + timedelta(seconds=ttl_s),
    )  # fmt: skip


async def test_a_request_is_recorded_pending_with_what_the_approver_sees(store: Store) -> None:
    """A new request is pending under a fresh id, with its target, binding, approvers and arguments."""
    record, created = await store.request_approval(new_request(arguments={"path": "/x"}), now=NOW)
    assert created and record.state is ApprovalState.PENDING and record.pending
    assert record.approval_id.startswith("apr_") and len(record.approval_id) == 4 + 32
    assert (record.server, record.tool, record.binding, record.execution_id) == (
        "tools",
        "delete",
        BINDING,
        "exec-1",
    )
    assert record.approvers == ("alice", "bob") and record.arguments == {"path": "/x"}
    assert record.human == "ada@example.org" and record.grant == "guarded"
    assert record.requested_at == NOW and record.expires_at == NOW + timedelta(seconds=60)
    assert (record.decided_at, record.decided_by) == (None, None)
    assert await store.get_approval(record.approval_id) == record
    assert await store.get_approval("apr_unknown") is None


async def test_the_first_decision_wins_and_a_decided_request_never_moves(store: Store) -> None:
    """Approve then deny: the denial changes nothing; a timeout after the approval changes nothing."""
    record, _ = await store.request_approval(new_request(), now=NOW)
    decided = await store.decide_approval(
        record.approval_id, ApprovalState.APPROVED, by="alice", note="ok", now=later(1)
    )
    assert decided is not None
    approved, changed = decided
    assert changed and approved.state is ApprovalState.APPROVED
    assert (approved.decided_by, approved.decided_at, approved.note) == ("alice", later(1), "ok")
    for state, by in ((ApprovalState.DENIED, "bob"), (ApprovalState.TIMED_OUT, None)):
        again = await store.decide_approval(record.approval_id, state, by=by, note=None, now=later(2))
        assert again == (approved, False)
    assert (
        await store.decide_approval("apr_unknown", ApprovalState.DENIED, by="bob", note=None, now=NOW) is None
    )


async def test_an_approvers_decision_after_expiry_does_not_count(store: Store) -> None:
    """Past ``expires_at`` an approval leaves the request pending; the waiting call then times it out."""
    record, _ = await store.request_approval(new_request(ttl_s=5), now=NOW)
    late = await store.decide_approval(
        record.approval_id, ApprovalState.APPROVED, by="alice", note=None, now=later(6)
    )
    assert late is not None and late[1] is False and late[0].state is ApprovalState.PENDING
    timed = await store.decide_approval(
        record.approval_id, ApprovalState.TIMED_OUT, by=None, note=None, now=later(6)
    )
    assert timed is not None and timed[1] and timed[0].state is ApprovalState.TIMED_OUT


async def test_one_live_request_per_execution_whatever_its_arguments(store: Store) -> None:
    """A second attempt of one execution finds the first request (other binding included)."""
    first, _ = await store.request_approval(new_request(), now=NOW)
    again, created = await store.request_approval(new_request(binding=OTHER), now=later(1))
    assert not created and again == first
    await store.decide_approval(first.approval_id, ApprovalState.DENIED, by="bob", note=None, now=later(1))
    denied, created = await store.request_approval(new_request(), now=later(2))
    assert not created and denied.state is ApprovalState.DENIED


async def test_a_timed_out_or_cancelled_request_lets_the_execution_ask_again(store: Store) -> None:
    """Only pending, approved and denied requests are live: after a timeout the execution asks anew."""
    first, _ = await store.request_approval(new_request(), now=NOW)
    await store.decide_approval(first.approval_id, ApprovalState.CANCELLED, by=None, note=None, now=later(1))
    second, created = await store.request_approval(new_request(), now=later(2))
    assert created and second.approval_id != first.approval_id and second.pending


async def test_requests_without_an_execution_id_are_each_their_own(store: Store) -> None:
    """Without an execution id every call asks anew; listing is newest first and filters by state."""
    one, _ = await store.request_approval(new_request(execution=None), now=NOW)
    two, created = await store.request_approval(new_request(execution=None), now=later(1))
    assert created and one.approval_id != two.approval_id
    await store.decide_approval(one.approval_id, ApprovalState.DENIED, by="bob", note=None, now=later(2))
    assert [r.approval_id for r in await store.list_approvals()] == [two.approval_id, one.approval_id]
    pending = await store.list_approvals(state=ApprovalState.PENDING)
    assert [r.approval_id for r in pending] == [two.approval_id]
    assert len(await store.list_approvals(limit=1)) == 1


async def test_concurrent_decisions_leave_exactly_one_winner(store: Store, replica: Store) -> None:
    """An approval, a denial and a timeout racing at two replicas: exactly one moves the request."""
    record, _ = await store.request_approval(new_request(), now=NOW)
    results: list[bool] = []

    async def move(at: Store, state: ApprovalState, by: str | None) -> None:
        found = await at.decide_approval(record.approval_id, state, by=by, note=None, now=later(1))
        assert found is not None
        results.append(found[1])

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(move, store, ApprovalState.APPROVED, "alice")
            tg.start_soon(move, replica, ApprovalState.DENIED, "bob")
            tg.start_soon(move, replica, ApprovalState.TIMED_OUT, None)
    assert sorted(results) == [False, False, True]
    assert await replica.get_approval(record.approval_id) == await store.get_approval(record.approval_id)


async def test_concurrent_requests_of_one_execution_record_one(store: Store, replica: Store) -> None:
    """Two attempts of one execution asking at two replicas at once: one request, both see it
    (or one a Conflict)."""
    seen: list[str] = []

    async def ask(at: Store) -> None:
        try:
            record, _ = await at.request_approval(new_request(), now=NOW)
        except Conflict:
            return
        seen.append(record.approval_id)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, store)
            tg.start_soon(ask, replica)
    assert seen and len(set(seen)) == 1
    assert len(await store.list_approvals()) == 1


async def test_a_wrapping_store_passes_approvals_through(store: Store) -> None:
    """The fault-injecting wrapper forwards every approval method unchanged."""
    wrapped = FaultyStore(store)
    record, _ = await wrapped.request_approval(new_request(), now=NOW)
    assert await wrapped.get_approval(record.approval_id) == record
    assert await wrapped.list_approvals() == [record]
    decided = await wrapped.decide_approval(
        record.approval_id, ApprovalState.APPROVED, by="alice", note=None, now=NOW
    )
    assert decided is not None and decided[1]
