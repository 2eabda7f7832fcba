"""Operations on approval requests (store/approvals.py): the first move from pending wins."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId
from bastion.store.approvals import ApprovalRecord, ApprovalState, NewApproval
from bastion.store.replicas import ChangeKind
from bastion.store.rows import from_us
from bastion.store.statements import Op, count, execute, one, rows

SELECT_APPROVAL = (
    "SELECT approval_id, agent, agent_session_id, human, server, tool, binding, execution_id, call_id,"
    " evidence_session_id, grant_name, approvers, arguments, state, requested_at, expires_at,"
    " decided_at, decided_by, note FROM approvals"
)
_LIVE = ("pending", "approved", "denied")


def approval_from_row(row: tuple[Any, ...]) -> ApprovalRecord:
    arguments = None if row[12] is None else json.loads(row[12])
    return ApprovalRecord(
        row[0], AgentId(row[1]), row[2], row[3], row[4], row[5], row[6],
        None if row[7] is None else ExecutionId(row[7]), CallId(row[8]),
        None if row[9] is None else EvidenceSessionId(row[9]),
        row[10], tuple(json.loads(row[11])), arguments, ApprovalState(row[13]),
        from_us(row[14]), from_us(row[15]), None if row[16] is None else from_us(row[16]), row[17], row[18],
    )  # fmt: skip


def _dumps(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def request_approval(
    approval_id: str, request: NewApproval, now_us: int, expires_us: int
) -> Op[tuple[ApprovalRecord, bool]]:
    if request.execution_id is not None:
        # The row lock orders two attempts of one execution at PostgreSQL; the partial unique
        # index (migrations) refuses the second insert of a race either engine lets through.
        row = yield from one(
            SELECT_APPROVAL + " WHERE agent = ? AND execution_id = ? AND state IN (?, ?, ?)",
            request.agent, request.execution_id, *_LIVE, lock="FOR UPDATE",
        )  # fmt: skip
        if row is not None:
            return approval_from_row(row), False
    yield from execute(
        "INSERT INTO approvals (approval_id, agent, agent_session_id, human, server, tool, binding,"
        " execution_id, call_id, evidence_session_id, grant_name, approvers, arguments, state,"
        " requested_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        approval_id, request.agent, request.agent_session_id, request.human, request.server, request.tool,
        request.binding, request.execution_id, request.call_id, request.evidence_session_id, request.grant,
        json.dumps(list(request.approvers)), _dumps(request.arguments), ApprovalState.PENDING.value,
        now_us, expires_us,
    )  # fmt: skip
    created = yield from one(SELECT_APPROVAL + " WHERE approval_id = ?", approval_id)
    assert created is not None
    return approval_from_row(created), True


def get_approval(approval_id: str) -> Op[ApprovalRecord | None]:
    row = yield from one(SELECT_APPROVAL + " WHERE approval_id = ?", approval_id)
    return None if row is None else approval_from_row(row)


def list_approvals(state: ApprovalState | None, limit: int) -> Op[list[ApprovalRecord]]:
    if state is None:
        found = yield from rows(SELECT_APPROVAL + " ORDER BY requested_at DESC, approval_id LIMIT ?", limit)
    else:
        found = yield from rows(
            SELECT_APPROVAL + " WHERE state = ? ORDER BY requested_at DESC, approval_id LIMIT ?",
            state.value, limit,
        )  # fmt: skip
    return [approval_from_row(row) for row in found]


def decide_approval(
    approval_id: str, state: ApprovalState, by: str | None, note: str | None, now_us: int
) -> Op[tuple[ApprovalRecord, bool] | None]:
    # An approver's decision counts only before the request expires; the waiting call's own
    # ending (timed_out, cancelled) at any time. Either way only a pending row moves.
    by_approver = state in (ApprovalState.APPROVED, ApprovalState.DENIED)
    changed = yield from count(
        "UPDATE approvals SET state = ?, decided_at = ?, decided_by = ?, note = ?"
        " WHERE approval_id = ? AND state = ? AND (? = 0 OR expires_at > ?)",
        state.value, now_us, by, note, approval_id, ApprovalState.PENDING.value, int(by_approver), now_us,
    )  # fmt: skip
    if changed:
        # In the same transaction: every replica's change feed (PostgreSQL: LISTEN) hears of it,
        # so the replica holding the waiting call learns the decision without waiting for a poll.
        yield from execute(
            "INSERT INTO changes (kind, subject, detail, origin, at) VALUES (?, ?, ?, ?, ?)",
            ChangeKind.APPROVAL_DECIDED.value, approval_id, None, None, now_us,
        )  # fmt: skip
    row = yield from one(SELECT_APPROVAL + " WHERE approval_id = ?", approval_id)
    if row is None:
        return None
    return approval_from_row(row), changed == 1
