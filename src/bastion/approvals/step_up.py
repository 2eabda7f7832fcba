"""The call's side of step-up approval: ask, wait, audit, answer (issue 27, DESIGN section 8).

Reached from ``call.py`` after the grant decision and the attachment gate, and
before execution admission, for a call whose allowing grant has an
``approval`` rule. In order:

1. Ask: record an approval request in the store, bound to the call's binding
   digest and execution id (``store/approvals.py``). An execution that already
   has a live request does not ask again: another binding's request refuses the
   call (``approval_mismatch``: an approval is never reused for other
   arguments), a denial stands (``approval_denied``), a request still pending is
   another attempt in flight (``execution_in_flight``), and an approval lets the
   call on to admission, which classifies a retry after it ran as the replay it
   is. Otherwise the ``approval_requested`` entry goes into the call's chain.
2. Wait, bounded by the rule's ``timeout_s``: woken when a decision lands here
   or arrives by the change feed from another replica, re-reading the store at
   least every ``POLL_S`` meanwhile; a client that sent a ``progressToken``
   hears ``notifications/progress`` on each round.
3. Answer: ``approval_granted`` (the call goes on), ``approval_denied``,
   ``approval_timed_out`` or, when the waiting call is cancelled (its client
   went away), ``approval_cancelled``; each names the approver and the times.
   The store's first move from pending wins, so a timeout racing an approval
   gives one answer at every replica. A refusal is raised typed (``errors.py``,
   -32090..-32093) and ``call.py`` audits it as every refusal is audited.

Never sends anything upstream, never shows the arguments to an approver
unless the grant says so, and never lets a wait outlive its timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from bastion.approvals.waiters import ApprovalWaiters
from bastion.audit.entry import AuditEvent, Decision
from bastion.caller import Caller
from bastion.errors import (
    ApprovalCancelled,
    ApprovalDenied,
    ApprovalMismatch,
    ApprovalRefused,
    ApprovalTimeout,
)
from bastion.ids import AgentId, CallId, EvidenceSessionId, ExecutionId
from bastion.policy.approval_rules import ApprovalRule
from bastion.store.approvals import ApprovalRecord, ApprovalState, ApprovalStore, NewApproval

__all__ = ["POLL_S", "ApprovalAsk", "StepUp"]

POLL_S = 1.0  # the bound on learning a decision when no wake arrives (DESIGN section 7: 1 s)

Record = Callable[..., Awaitable[None]]
"""``record(event, **fields)``: one entry of the call's chain, durable before the call goes on."""
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class ApprovalAsk:
    """One call asking for approval: who, what, bound to which binding and execution."""

    agent: AgentId
    agent_session_id: str | None
    human: str | None
    server: str
    tool: str
    binding: str
    execution_id: ExecutionId | None
    call_id: CallId
    evidence_session_id: str | None
    arguments: Mapping[str, Any]
    grant: str
    rule: ApprovalRule
    progress_token: str | int | None = None

    @classmethod
    def of(
        cls,
        caller: Caller,
        approval: tuple[str, ApprovalRule],
        *,
        server: str,
        tool: str,
        binding: str,
        execution_id: ExecutionId | None,
        call_id: CallId,
        evidence_session_id: str | None,
        arguments: Mapping[str, Any],
        progress_token: str | int | None,
    ) -> ApprovalAsk:
        """The ask of ``caller``'s call under the allowing grant's ``(name, rule)``."""
        principal = caller.principal
        return cls(
            principal.agent, principal.agent_session_id, principal.human, server, tool, binding,
            execution_id, call_id, evidence_session_id, arguments, approval[0], approval[1], progress_token,
        )  # fmt: skip


class StepUp:
    """Step-up approval for the calls of one gateway; the waiters are this gateway's alone."""

    def __init__(
        self,
        store: ApprovalStore,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        poll_s: float = POLL_S,
    ) -> None:
        self._store = store
        self._now = now
        self._poll_s = poll_s
        self.waiters = ApprovalWaiters()

    def wake(self, approval_id: str) -> None:
        """A decision on ``approval_id`` landed (here or, by the change feed, elsewhere)."""
        self.waiters.wake(approval_id)

    async def require(self, ask: ApprovalAsk, *, record: Record, notify: Notify | None) -> None:
        """Return once an approver approved this call; otherwise raise.

        Raises:
            ApprovalDenied, ApprovalTimeout, ApprovalMismatch: the call must not run.
            ApprovalCancelled: a joined attempt whose request was cancelled by the attempt that
                asked (a cancelled wait of its own re-raises the cancellation instead).
            StoreError: the request could not be recorded or read (nothing was sent).
        """
        # (1) Ask.
        started = self._now()
        record_ask, created = await self._store.request_approval(
            NewApproval(
                agent=ask.agent,
                agent_session_id=ask.agent_session_id,
                human=ask.human,
                server=ask.server,
                tool=ask.tool,
                binding=ask.binding,
                execution_id=ask.execution_id,
                call_id=ask.call_id,
                evidence_session_id=None
                if ask.evidence_session_id is None
                else EvidenceSessionId(ask.evidence_session_id),
                grant=ask.grant,
                approvers=ask.rule.approvers,
                arguments=dict(ask.arguments) if ask.rule.show_arguments else None,
                expires_at=started + timedelta(seconds=ask.rule.timeout_s),
            ),
            now=started,
        )
        approval_id = record_ask.approval_id
        if not created:
            self._earlier_request(record_ask, ask)
            if not record_ask.pending:
                return  # approved earlier for this very binding and execution: admission decides
        await record(
            AuditEvent.APPROVAL_REQUESTED,
            detail={
                "approval_id": approval_id,
                "grant": ask.grant,
                "approvers": list(record_ask.approvers),
                "timeout_s": ask.rule.timeout_s,
                "arguments_shown": record_ask.arguments is not None,
                "expires_at": _iso(record_ask.expires_at),
                # A retry of an execution whose request still waits (its first attempt's replica
                # may be gone) waits on that request instead of asking again.
                "joined": not created,
            },
        )
        # (2) Wait.
        try:
            decided = await self._wait(record_ask, ask, notify)
        except anyio.get_cancelled_exc_class():
            if created:  # a joined attempt leaves the request to the others waiting on it
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await self._give_up(approval_id, ApprovalState.CANCELLED, ask, record)
            raise
        # (3) Answer.
        await self._answer(decided, ask, record)

    def _earlier_request(self, earlier: ApprovalRecord, ask: ApprovalAsk) -> None:
        """The execution's live request, found instead of a new one: refuse unless it approved this."""
        data = {"approval_id": earlier.approval_id, "execution_id": ask.execution_id}
        if earlier.binding != ask.binding:
            raise ApprovalMismatch(
                "This execution's approval was asked for other arguments; it is not reused", **data
            )
        if earlier.state is ApprovalState.DENIED:
            raise ApprovalDenied("An approver denied this execution", **data)

    async def _wait(self, request: ApprovalRecord, ask: ApprovalAsk, notify: Notify | None) -> ApprovalRecord:
        approval_id = request.approval_id
        # Bounded by the request's own expiry (a joined attempt waits no longer than the first).
        timeout_s = max(0.0, (request.expires_at - self._now()).total_seconds())
        rounds = 0
        with anyio.move_on_after(timeout_s):
            while True:
                current = await self._store.get_approval(approval_id)
                if current is not None and not current.pending:
                    return current
                if notify is not None and ask.progress_token is not None:
                    await notify(
                        "notifications/progress",
                        {
                            "progressToken": ask.progress_token,
                            "progress": rounds,
                            "message": f"waiting for approval {approval_id}",
                        },
                    )
                rounds += 1
                await self.waiters.wait(approval_id, self._poll_s)
        # The timeout: the store's first move wins (an approval may have landed just now).
        moved = await self._store.decide_approval(
            approval_id, ApprovalState.TIMED_OUT, by=None, note=None, now=self._now()
        )
        assert moved is not None
        return moved[0]

    async def _give_up(
        self, approval_id: str, state: ApprovalState, ask: ApprovalAsk, record: Record
    ) -> None:
        moved = await self._store.decide_approval(approval_id, state, by=None, note=None, now=self._now())
        if moved is not None and moved[1]:
            await record(
                AuditEvent.APPROVAL_CANCELLED,
                decision=Decision.DENY.value,
                reason=ApprovalCancelled.reason.value,
                detail=_decision_detail(moved[0]),
            )

    async def _answer(self, decided: ApprovalRecord, ask: ApprovalAsk, record: Record) -> None:
        detail = _decision_detail(decided)
        if decided.state is ApprovalState.APPROVED:
            await record(AuditEvent.APPROVAL_GRANTED, decision=Decision.ALLOW.value, detail=detail)
            return
        refusal: ApprovalRefused
        if decided.state is ApprovalState.DENIED:
            event = AuditEvent.APPROVAL_DENIED
            refusal = ApprovalDenied(f"Approver {decided.decided_by} denied this call")
        elif decided.state is ApprovalState.CANCELLED:
            # The attempt that asked went away; this one waited on its request (a joined retry).
            event = AuditEvent.APPROVAL_CANCELLED
            refusal = ApprovalCancelled("The attempt that asked for this approval went away; ask again")
        else:
            event = AuditEvent.APPROVAL_TIMED_OUT
            refusal = ApprovalTimeout(
                f"No approver decided this call within {ask.rule.timeout_s:g} s", timeout_s=ask.rule.timeout_s
            )
        refusal.data["approval_id"] = decided.approval_id
        await record(event, decision=Decision.DENY.value, reason=refusal.reason.value, detail=detail)
        raise refusal


def _decision_detail(record: ApprovalRecord) -> dict[str, Any]:
    return {
        "approval_id": record.approval_id,
        "state": record.state.value,
        "approver": record.decided_by,
        "requested_at": _iso(record.requested_at),
        "decided_at": _iso(record.decided_at),
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")
