"""Step-up approvals in the store: one row per request, decided once, at any replica (issue 27).

A grant may require a named approver's yes before a call runs. The call that
needs one records a request here: who asks (agent, agent session, the human
behind it when known), what (server, tool, the call's binding digest, its
execution id, its arguments only when the grant shows them), who may decide
(the grant's approvers) and until when. An approver at any replica decides
it; the replica holding the call reads the decision from here.

A request moves from ``pending`` exactly once: to ``approved`` or ``denied``
(an approver's decision, only before ``expires_at``), or to ``timed_out`` or
``cancelled`` (the waiting call gave up). The first move wins, whichever
replica makes it, so an approval and a timeout racing each other leave one
answer that both sides read. A decided row never changes again.

Per ``(agent, execution_id)`` at most one request is live (``pending``,
``approved`` or ``denied``): a second attempt of that execution finds it
instead of asking again, so an approval is never reused for other arguments
(the binding differs) and a denial stands. Unfenced, as tasks are: a row
records what a person said, not gateway evidence (that is the audit chain).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId

__all__ = ["ApprovalRecord", "ApprovalState", "ApprovalStore", "NewApproval"]


class ApprovalState(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class NewApproval:
    """A call asking for approval: its owner, target, binding, and who may decide until when."""

    agent: AgentId
    agent_session_id: str | None
    human: str | None
    server: str
    tool: str
    binding: str
    execution_id: ExecutionId | None
    call_id: CallId
    evidence_session_id: EvidenceSessionId | None  # the call's chain when it asked, if open
    grant: str
    approvers: tuple[str, ...]
    arguments: Mapping[str, Any] | None
    expires_at: datetime

    def __post_init__(self) -> None:
        if not (self.agent and self.server and self.tool and self.binding and self.call_id):
            raise ValueError("an approval request needs an agent, a server, a tool, a binding and a call")
        if not self.approvers:
            raise ValueError("an approval request needs at least one approver")
        object.__setattr__(self, "approvers", tuple(self.approvers))


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval request and, once decided, who decided it and when."""

    approval_id: str
    agent: AgentId
    agent_session_id: str | None
    human: str | None
    server: str
    tool: str
    binding: str
    execution_id: ExecutionId | None
    call_id: CallId
    evidence_session_id: EvidenceSessionId | None  # the call's chain when it asked, if open
    grant: str
    approvers: tuple[str, ...]
    arguments: Mapping[str, Any] | None
    state: ApprovalState
    requested_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    note: str | None

    @property
    def pending(self) -> bool:
        return self.state is ApprovalState.PENDING


class ApprovalStore(Protocol):
    async def request_approval(self, request: NewApproval, *, now: datetime) -> tuple[ApprovalRecord, bool]:
        """The live request of this execution, or a new ``pending`` one; and whether it is new.

        With an execution id, a live request of ``(agent, execution_id)``
        (pending, approved or denied, whatever its binding) is returned as it
        is, ``False``: the caller compares bindings. Otherwise a fresh request
        under a random ``approval_id``, ``True``. Atomic.
        """
        ...

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        """The request, or ``None`` for an unknown id."""
        ...

    async def list_approvals(
        self, *, state: ApprovalState | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        """Requests, newest first, at most ``limit``; only those in ``state`` when given."""
        ...

    async def decide_approval(
        self, approval_id: str, state: ApprovalState, *, by: str | None, note: str | None, now: datetime
    ) -> tuple[ApprovalRecord, bool] | None:
        """Move a pending request to ``state``; the record and whether this call moved it.

        ``approved`` and ``denied`` need ``by`` (an approver) and ``now`` before
        ``expires_at``; ``timed_out`` and ``cancelled`` are the waiting call's.
        A request already decided stays as it is (``False``): the first move
        wins at every replica. ``None`` for an unknown id.
        """
        ...
