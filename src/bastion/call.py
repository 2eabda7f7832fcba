"""One ``tools/call``, step by step as DESIGN section 2 numbers them.

Steps 1 (transport) and 2 (authentication) happened before this module is
reached: the :class:`~bastion.caller.Caller` is their product. This module
owns steps 3 to 8 and is the one place to read the life of a tool call.
Every refusal is raised as a typed error, written to the audit chain first,
and carries a receipt; ``transport/`` renders it.

Order of the durable writes, for a call with an execution id (DESIGN section 3):
[reserve (atomic, with binding), mark ``invoking``, audit ``admitted`` and
``invoking``] in one transaction → send → [record the terminal state, audit
it] in one transaction → answer. To an upstream that is not connected:
reserve alone (a replay is still classified), then release. Without an
execution id: audit ``admitted`` → send → audit the outcome → answer, for a
tool that is not ``readOnlyHint``; a read-only one writes both after the send.
Every entry's ``ts`` is the time of its event, not of its write.
A write that cannot be made durable stops the call there, fail closed: the
execution stays non-terminal (hence refused), the store is marked degraded,
and the audit entry owed is written once storage returns.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from opentelemetry.trace import Span

from bastion.admission.binding import bind_call
from bastion.admission.continuation import InputContinuations
from bastion.admission.envelope import CmcpEnvelope, read_envelope
from bastion.admission.rounds import RoundCall, RoundStates
from bastion.admission.states import ExecutionState
from bastion.approvals.step_up import ApprovalAsk, StepUp
from bastion.audit.earlier import name_earlier_attempt
from bastion.audit.entry import AuditEntry, AuditEvent, Decision
from bastion.audit.recorder import EVENT_AT
from bastion.audit.scope import EvidenceScope
from bastion.call_context import call_context, progress_token
from bastion.call_telemetry import CallTelemetry, outcome_of_error
from bastion.caller import Caller
from bastion.errors import (
    BastionError,
    CallRefused,
    ExecutionCollision,
    ExecutionInFlight,
    ExecutionReplay,
    GrantDenied,
    HeaderMismatch,
    InvalidParams,
    NotDurable,
    StaleEpoch,
    StoreError,
    UnknownTool,
    UpstreamError,
    UpstreamUnavailable,
)
from bastion.ids import CallId, Epoch, ExecutionId, WorkerId, new_call_id
from bastion.metrics import UNKNOWN_TOOL
from bastion.param_headers import check_param_headers
from bastion.pinning.book import check_not_withheld
from bastion.policy.decide import RateLimiter, decide, visible_tools
from bastion.policy.grants import Rate
from bastion.policy.shared_limits import StoreRateLimiter
from bastion.policy.snapshot import Snapshot
from bastion.settle import send_and_settle
from bastion.store.base import ExecutionStep, Store
from bastion.store.health import StoreHealth
from bastion.surface.limits import SurfaceLimits
from bastion.tasks.relay import TaskRelay
from bastion.tasks.support import TASK_PARAM
from bastion.tracing import NO_SPAN as _NO_SPAN
from bastion.tracing import child_span, inject_meta, record_contents, set_outcome
from bastion.upstream.base import UpstreamReplied
from bastion.upstream.fleet import ToolEntry, UpstreamFleet
from bastion.workers.attachment import AttachmentTracker, sessionless_ref, transport_session_ref
from bastion.workers.late_write import LateWrite
from bastion.workers.membership import WorkerMembership

__all__ = ["RECEIPT_META_KEY", "ToolCallPath", "strip_reserved_meta"]

logger = logging.getLogger(__name__)

RECEIPT_META_KEY = "io.bastion/receipt"
_LATE_WRITE_REPORT_S = 10.0  # bound on recording what a superseded worker observed
_RESERVED_META_PREFIX = "io.modelcontextprotocol/"


def strip_reserved_meta(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` without the client's protocol envelope keys (the upstream gets the gateway's own)."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        return params
    kept = {k: v for k, v in meta.items() if not k.startswith(_RESERVED_META_PREFIX)}
    out = {k: v for k, v in params.items() if k != "_meta"}
    if kept:
        out["_meta"] = kept
    return out


@dataclass
class _Attempt:
    """What one attempt has established so far, for its audit entries and its receipt."""

    call_id: CallId
    policy_version: str
    envelope: CmcpEnvelope = field(default_factory=CmcpEnvelope)
    entry: ToolEntry | None = None
    binding: str | None = None
    args_digest: str | None = None
    last: AuditEntry | None = None
    pending: list[tuple[AuditEvent, dict[str, Any]]] = field(default_factory=list)
    charged: tuple[tuple[str, Rate], ...] = ()  # rate-limit tokens taken, until the call is sent
    sent: bool = False
    # For telemetry (call_telemetry.py): the outcome recorded (a terminal state or
    # input_required) and its reason, the reason of a refusal as audited, the upstream's time.
    outcome: str | None = None
    outcome_reason: str | None = None
    refusal_reason: str | None = None
    upstream_s: float | None = None

    def fields(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "workflow_id": self.envelope.workflow_id,
            "execution_id": self.envelope.execution_id,
            "server": self.entry.server if self.entry else None,
            "tool": self.entry.upstream_name if self.entry else None,
            "args_digest": self.args_digest,
            "binding": self.binding,
            "policy_version": self.policy_version,
        }


class ToolCallPath:
    """Runs one tools/call for one caller against the snapshot in force."""

    def __init__(
        self,
        fleet: UpstreamFleet,
        snapshot: Callable[[], Snapshot],
        *,
        store: Store,
        membership: WorkerMembership,
        health: StoreHealth,
        limiter: RateLimiter,
        attachments: AttachmentTracker,
        monotonic: Callable[[], float] = time.monotonic,
        shared_limits: StoreRateLimiter | None = None,
        on_late_write: Callable[[LateWrite], Awaitable[object]] | None = None,
        telemetry: CallTelemetry | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._tracing = telemetry.tracing if telemetry is not None else None
        self._on_late_write = on_late_write
        self._attachments = attachments
        self._limiter = limiter
        # Rate-limit tokens from the store (shared by replicas) instead of ``limiter``, when given.
        self._shared_limits = shared_limits
        self._monotonic = monotonic
        self._fleet = fleet
        self._snapshot = snapshot
        self._store = store
        self._membership = membership
        self._health = health
        self._continuations = InputContinuations()
        # The requestState tokens handed out, each bound to its call (issue #22); the surface
        # paths (prompts/get, resources/read) bind theirs here too.
        self.rounds = RoundStates(monotonic=monotonic)
        # Grant rate limits on resources, prompts and completion: the same limiters (issue 9).
        self.surface_limits = SurfaceLimits(limiter, shared_limits, monotonic)
        self.step_up = StepUp(store)  # issue 27: the gateway wakes it and the admin API decides
        # Tasks a call asked for, owned in the store and routed back to their upstream (issue 24).
        self.tasks = TaskRelay(store, fleet, snapshot, metrics=telemetry.metrics if telemetry else None)

    async def call_tool(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """Decide, admit, relay and record one tool call; returns the upstream's result with a receipt.

        Raises:
            CallRefused: refused (unknown tool, invalid ``_cmcp``, collision, in flight, replay).
            InvalidParams: ``name``/``arguments`` malformed.
            UpstreamError: the upstream failed (see ``upstream/base.py``).
            StoreError: a durable write failed (``NotDurable``, ``StaleEpoch``).
            UpstreamReplied: the upstream answered with a JSON-RPC error.
        """
        snapshot = self._snapshot()  # one snapshot decides the whole call
        attempt = _Attempt(call_id=new_call_id(), policy_version=snapshot.version)
        telemetry = self._telemetry
        if telemetry is None:
            return await self._governed(caller, params, snapshot, attempt)
        in_flight = telemetry.metrics.in_flight_of("tools/call")
        in_flight.inc()
        started = time.perf_counter()
        error: BaseException | None = None
        with (
            telemetry.tracing.call_span("tools/call", params.get("_meta"), {"mcp.method.name": "tools/call"})
            if telemetry.tracing is not None
            else _NO_SPAN
        ) as span:
            try:
                return await self._governed(caller, params, snapshot, attempt)
            except BaseException as exc:
                error = exc
                raise
            finally:
                in_flight.dec()
                self._report(telemetry, caller, attempt, time.perf_counter() - started, error, span)

    def _report(
        self,
        telemetry: CallTelemetry,
        caller: Caller,
        attempt: _Attempt,
        total_s: float,
        error: BaseException | None,
        span: Span | None = None,
    ) -> None:
        """The call's metrics, access line and span attributes (call_telemetry.py, tracing.py):
        never raises into the call."""
        if attempt.outcome is not None:
            outcome, reason = attempt.outcome, attempt.outcome_reason or ""
        else:
            outcome, reason = outcome_of_error(error)
            if attempt.refusal_reason is not None:
                reason = attempt.refusal_reason  # as audited (grant_denied is answered unknown_tool)
            elif attempt.sent and outcome == "refused":
                outcome = "error"  # sent, but its outcome could not be recorded (not_durable, ...)
        entry, last = attempt.entry, attempt.last
        try:
            if span is not None:
                _describe_span(span, caller, attempt, outcome, reason)
            telemetry.tool_call(
                str(caller.agent),
                server=entry.server if entry else "",
                tool=entry.upstream_name if entry else UNKNOWN_TOOL,
                outcome=outcome,
                reason=reason,
                total_s=total_s,
                upstream_s=attempt.upstream_s,
                call_id=attempt.call_id,
                execution_id=attempt.envelope.execution_id,
                evidence_session_id=last.session_id if last else None,
                seq=last.seq if last else None,
            )
        except Exception:
            logger.exception("call telemetry failed")

    async def _governed(
        self, caller: Caller, params: dict[str, Any], snapshot: Snapshot, attempt: _Attempt
    ) -> dict[str, Any]:
        scope = caller.evidence
        try:
            return await self._run_charged(caller, params, snapshot, attempt, scope)
        except StaleEpoch as exc:
            # A newer epoch holds this worker's generation: it stops serving from now on, and the
            # caller hears that (not a storage failure): issue #11 point 5.
            self._membership.mark_superseded("a write was refused")
            data = {k: v for k, v in exc.data.items() if k != "audited"}
            raise StaleEpoch(
                "This gateway worker was superseded by a newer epoch; its write was refused. "
                "The execution's outcome is the one its recovery recorded.",
                **data,
                receipt=self._receipt(scope, attempt),
            ) from exc
        except (CallRefused, InvalidParams, HeaderMismatch) as exc:
            if not exc.data.get("audited"):
                await self._audit_refusal(scope, attempt, exc)
            exc.data.pop("audited", None)
            exc.data["receipt"] = self._receipt(scope, attempt)
            raise
        except (UpstreamError, StoreError) as exc:
            exc.data.pop("audited", None)
            exc.data["receipt"] = self._receipt(scope, attempt)
            raise
        finally:
            scope.end_call(attempt.call_id)  # its chain slots are free (audit/recorder.py)

    async def _run_charged(
        self,
        caller: Caller,
        params: dict[str, Any],
        snapshot: Snapshot,
        attempt: _Attempt,
        scope: EvidenceScope,
    ) -> dict[str, Any]:
        try:
            return await self._run(caller, params, snapshot, attempt, scope)
        except BaseException:
            # A call refused before the send spends no rate-limit token (issue #12).
            if attempt.charged and not attempt.sent and attempt.entry is not None:
                agent, server, tool = (
                    str(caller.principal.agent),
                    attempt.entry.server,
                    attempt.entry.upstream_name,
                )
                if self._shared_limits is not None:
                    await self._shared_limits.refund(attempt.charged, agent, server, tool)
                else:
                    self._limiter.refund(attempt.charged, agent, server, tool, self._monotonic())
            raise

    async def _run(
        self,
        caller: Caller,
        params: dict[str, Any],
        snapshot: Snapshot,
        attempt: _Attempt,
        scope: EvidenceScope,
    ) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments", {})
        if not isinstance(name, str):
            raise InvalidParams("Invalid params: tools/call needs a string name")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise InvalidParams("Invalid params: tools/call arguments must be an object")
        attempt.envelope, params = read_envelope(params)

        # (3) Agent session check: done on this very request by the authenticator (expiry and
        #     revocation as of now); a revocation also cancels calls already in flight (gateway.py).
        # (4) Grant decision against the one snapshot in force; its version goes into every entry.
        entry = self._fleet.lookup(name)
        if entry is None:
            # A tool only this client's capabilities show (issue 22): its view, listed for it.
            entry = await self._fleet.lookup_in_view(
                name,
                caller.client_capabilities,
                caller.transport_session.upstream_sessions if caller.transport_session is not None else None,
                log_level=caller.log_level,
                owner=str(caller.agent),
                owner_ref=caller.owner_ref,
                agent_session_id=caller.principal.agent_session_id,
            )
        if entry is None:
            raise UnknownTool(f"Unknown tool: {name}", tool=name)
        attempt.entry = entry
        contents = self._tracing is not None and snapshot.servers[entry.server].audit_contents
        if contents:  # the server's opt-in: the only way a value enters a span
            record_contents("gen_ai.tool.call.arguments", arguments)
        try:
            with child_span(self._tracing, "bastion.decision"):
                decision = decide(
                    snapshot,
                    caller.principal,
                    entry.server,
                    entry.namespace,
                    entry.upstream_name,
                    arguments,
                    now=self._monotonic(),
                    limiter=self._limiter if self._shared_limits is None else None,
                    has_execution_id=attempt.envelope.execution_id is not None,
                )
        except GrantDenied as exc:
            # A tool hidden by grants is answered as unknown: the caller learns nothing of what it
            # may not see; the audit keeps the truth (grant_denied, server, tool). Issue #12.
            await self._audit_refusal(scope, attempt, exc)
            raise UnknownTool(f"Unknown tool: {name}", tool=name, audited=True) from None
        check_not_withheld(entry)  # issue 27: a changed definition is refused until approved
        if self._shared_limits is not None:
            await self._shared_limits.take(
                decision.limits,
                str(caller.principal.agent),
                entry.server,
                entry.upstream_name,
                policy_version=snapshot.version,
            )
        attempt.charged = decision.limits
        if caller.param_headers is not None and entry.declares_param_headers:
            # After the grant decision: a tool the caller may not see stays unknown to it.
            # (A schema without x-mcp-header parameters checks nothing: the walk is skipped.)
            check_param_headers(entry.definition, arguments, caller.param_headers)
        # A task is relayed where the client asked for one and the tool and server take one
        # (tasks/relay.py); otherwise a tool that runs only as a task is refused by name, never
        # sent to fail upstream (tasks/support.py). After the grant decision: a hidden tool stays unknown.
        as_task = self.tasks.relays_task(caller, entry, params)
        if as_task is None:
            self.tasks.check_runs_without_task(entry, name)
        assert not (decision.require_execution_id and attempt.envelope.execution_id is None)
        attempt.binding, attempt.args_digest = bind_call(entry.server, entry.upstream_name, arguments)
        # A requestState continues only the call it was issued for: this agent, server, tool and
        # binding, once (admission/rounds.py, issue #22); the upstream's own value goes upstream.
        round_call = RoundCall(caller.agent, "tools/call", entry.server, entry.upstream_name, attempt.binding)
        try:
            upstream_state = self.rounds.take(round_call, params)
        except CallRefused as exc:
            await self._audit_refusal(scope, attempt, exc, detail={"cause": exc.cause})
            raise
        # (5) Attachment gate: a mutating tool is refused while a namespace this agent or team
        #     requires is not connected, not in the session's surface, or contradicts itself.
        required = snapshot.requirements.required_for(caller.agent, caller.principal.team)
        if required and not entry.read_only:
            self._check_attachment(caller, snapshot, required)
        # (5b) Step-up approval (issue 27): the call waits for a named approver's yes, bound to
        #      its binding and execution id (approvals/step_up.py); a refusal is audited below.
        if decision.approval is not None:
            await self.step_up.require(
                ApprovalAsk.of(
                    caller, decision.approval, server=entry.server, tool=entry.upstream_name,
                    binding=attempt.binding, execution_id=attempt.envelope.execution_id,
                    call_id=attempt.call_id, evidence_session_id=scope.session_id, arguments=arguments,
                    progress_token=progress_token(params),
                ),
                record=lambda event, **extra: self._record(scope, attempt, event, **extra),
                notify=caller.relay.notify if caller.relay is not None else None,
            )  # fmt: skip

        # (6) Execution admission.
        try:
            self._health.check_admissions()
        except NotDurable as exc:
            # Refused while storage cannot write: the refusal is owed to the audit (bounded queue).
            self._health.failed(exc, owed=scope.owe([self._refusal(attempt, exc)]))
            raise
        execution_id = attempt.envelope.execution_id
        # The next round of an execution that asked its client for input is that execution
        # continuing (its row stayed invoking), not a replay: admission/continuation.py.
        continuation = (
            self._continuations.take(caller.agent, execution_id, attempt.binding, params)
            if execution_id is not None
            else None
        )
        # (7) Invoke: durable "invoking" first, then send on this client's own upstream session.
        upstream = self._fleet.upstreams[entry.server]
        if execution_id is not None and continuation is None and not upstream.health().connected:
            # Classified first (a replay stays a replay), then released: nothing can be sent.
            await self._admit(caller, attempt, scope, execution_id, step=None)
            self._queue(scope, attempt, AuditEvent.ADMITTED, decision=Decision.ALLOW.value)
            await self._release(caller, attempt, scope)
            raise UpstreamUnavailable(f"upstream {entry.server} is not connected")
        self._queue(scope, attempt, AuditEvent.ADMITTED, decision=Decision.ALLOW.value)
        if execution_id is not None and continuation is None:
            # The reservation, the durable "invoking" mark and the audit entries that say so: one
            # transaction (store/base.py ExecutionStep), durable before the send.
            self._queue(scope, attempt, AuditEvent.INVOKING)
            step = ExecutionStep(
                caller.agent,
                execution_id,
                ExecutionState.INVOKING,
                reserve_binding=attempt.binding,
                call_id=attempt.call_id,
            )
            # Shielded: a cancellation that lands while the mark commits would otherwise leave a
            # durable "invoking" row that no outcome follows. Cancellation is taken at the send
            # instead, inside send_and_settle, which records it as outcome_unknown.
            try:
                with anyio.CancelScope(shield=True), child_span(self._tracing, "bastion.admission"):
                    await self._admit(caller, attempt, scope, execution_id, step=step)
            except (ExecutionInFlight, ExecutionReplay):
                # The replay of an execution that created a task is that task, never a second one.
                task = await self.tasks.task_of_execution(caller, execution_id) if as_task else None
                replayed = (
                    await self.tasks.replayed(caller, task, as_task)
                    if task is not None and as_task is not None
                    else None
                )
                if replayed is None:
                    raise
                attempt.outcome, attempt.outcome_reason = "task_replayed", None
                return replayed
        elif execution_id is None and not entry.read_only:
            # Without an execution id there is no state to move, but a tool that may act has its
            # admitted entry durable before the send (group-committed with other writes), so a
            # crash leaves the call visible and recovery closes it outcome_unknown
            # (workers/recovery.py). Shielded like the mark above.
            with anyio.CancelScope(shield=True), child_span(self._tracing, "bastion.admission"):
                await self._record_pending(scope, attempt)

        # A read-only call's admitted entry is written with its outcome, durably, before the
        # answer (DESIGN section 2 step 8), stamped with the time it was admitted.
        async def send() -> dict[str, Any]:
            ctx = call_context(caller, snapshot, entry.server, params)
            request = self._upstream_params(entry, params, arguments)
            if as_task is not None:
                request = self.tasks.task_request(as_task, params, request)
            if upstream_state is not None:
                request["requestState"] = upstream_state
            sent_at = time.perf_counter()
            try:
                if self._tracing is None:
                    answer = await upstream.call("tools/call", request, ctx)
                else:
                    with self._tracing.child("bastion.upstream", current=True):
                        # The gateway's span context goes upstream (the HTTP upstream's headers too).
                        answer = await upstream.call("tools/call", inject_meta(request), ctx)
            finally:
                attempt.upstream_s = time.perf_counter() - sent_at
            return self.rounds.wrap(round_call, answer)

        async def finish(
            state: ExecutionState, *, reason: str | None, result_digest: str | None = None
        ) -> None:
            with child_span(self._tracing, "bastion.outcome"):
                await self._finish(caller, attempt, scope, state, reason=reason, result_digest=result_digest)
            attempt.outcome, attempt.outcome_reason = state.value, reason  # recorded, durably

        async def await_input(result: dict[str, Any]) -> None:
            # Not an outcome: the client is asked for input and comes back with the same call.
            if execution_id is not None and attempt.binding is not None:
                self._continuations.expect(
                    caller.agent, execution_id, attempt.binding, result.get("requestState")
                )
            attempt.outcome, attempt.outcome_reason = "input_required", "input_required"
            await self._record(scope, attempt, AuditEvent.INPUT_REQUIRED, reason="input_required")

        async def task_created(result: dict[str, Any]) -> dict[str, Any]:
            # Not an outcome: the execution stays invoking until the task ends (tasks/relay.py).
            await self._record_pending(scope, attempt)  # the chain holds the admitted entry first
            assert as_task is not None  # on_task is given only for a call relayed as a task
            answer, last = await self.tasks.created(
                caller,
                entry.server,
                result,
                attempt.fields(),
                attempt.last.session_id if attempt.last else None,
                as_task,
            )
            attempt.last = last or attempt.last
            attempt.outcome, attempt.outcome_reason = "task_created", None
            return answer

        # (8) Outcome: from here every way out (result, error, cancellation, garbage) records a
        #     durable terminal state, then its audit entry, then answers (settle.py).
        attempt.sent = True
        try:
            result = await send_and_settle(
                send,
                finish,
                on_input_required=await_input,
                on_task=task_created if as_task is not None else None,
            )
        except UpstreamReplied as exc:
            with child_span(self._tracing, "bastion.answer"):
                raise _with_receipt_meta(exc, self._receipt(scope, attempt)) from None
        with child_span(self._tracing, "bastion.answer"):  # the answer with its receipt
            if contents:
                record_contents("gen_ai.tool.call.result", result)
            meta = dict(result.get("_meta") or {})
            meta[RECEIPT_META_KEY] = self._receipt(scope, attempt)
            return {**result, "_meta": meta}

    # ------------------------------------------------------------------ durable steps

    async def _admit(
        self,
        caller: Caller,
        attempt: _Attempt,
        scope: EvidenceScope,
        execution_id: ExecutionId,
        *,
        step: ExecutionStep | None,
    ) -> None:
        """(6) Reserve the execution; with ``step``, also mark it invoking and write the queued
        entries, in the same transaction. Every refusal is audited, then raised."""
        worker, epoch = self._membership.credentials()
        assert attempt.binding is not None
        try:
            if step is None:
                await self._store.reserve_execution(
                    caller.agent,
                    execution_id,
                    attempt.binding,
                    call_id=attempt.call_id,
                    worker=worker,
                    epoch=epoch,
                )
            else:
                # Refused or not durable, none of these entries was written: they are dropped.
                batch, attempt.pending = attempt.pending, []
                entries = await scope.record_many(batch, durable=True, then=1, step=step)
                if entries:
                    attempt.last = entries[-1]
        except ExecutionCollision as exc:
            await self._audit_refusal(scope, attempt, exc, event=AuditEvent.COLLISION)
            raise
        except ExecutionReplay as exc:
            await name_earlier_attempt(self._store, caller.agent, execution_id, exc.data)
            earlier = {k: v for k, v in exc.data.items() if k.startswith("earlier_")}
            await self._audit_refusal(
                scope,
                attempt,
                exc,
                event=AuditEvent.REPLAY,
                outcome=exc.data.get("earlier_outcome"),
                detail=earlier,
            )
            raise
        except ExecutionInFlight as exc:
            await self._audit_refusal(scope, attempt, exc)
            raise
        except StoreError as exc:
            # Nothing was sent. The row is as the store left it (none, or invoking after a lost
            # acknowledgement): refused until storage returns, never guessed into permission;
            # then this worker settles an invoking row it owns as recovery would (issue #23).
            # The refusal that trips degraded mode is owed to the audit like the ones after it.
            owed = self._owed_refusal(scope, attempt, exc)
            if step is not None and owed is not None:
                owed = self._owed_admission(caller, attempt, scope, execution_id, exc, owed)
            self._health.failed(exc, owed=owed)
            raise

    def _owed_admission(
        self,
        caller: Caller,
        attempt: _Attempt,
        scope: EvidenceScope,
        execution_id: ExecutionId,
        exc: StoreError,
        owed_refusal: Callable[[], Awaitable[object]],
    ) -> Callable[[], Awaitable[object]]:
        """What a failed admission write owes once storage returns (issue #23 point 3).

        The write may have landed (a lost acknowledgement): then the row is ``invoking`` under this
        attempt's call, nothing was sent, and nobody will settle it while this worker lives. It
        becomes ``outcome_unknown``, as recovery would make it, under this worker's epoch, with the
        refusal and the outcome entry (late) in one transaction. Otherwise only the refusal is owed.
        """
        settle_step = ExecutionStep(caller.agent, execution_id, ExecutionState.OUTCOME_UNKNOWN)
        outcome = (
            AuditEvent.OUTCOME_UNKNOWN,
            {
                **attempt.fields(),
                "outcome": ExecutionState.OUTCOME_UNKNOWN.value,
                "reason": "admission_write_failed",
            },
        )
        write_settled = scope.owe([self._refusal(attempt, exc), outcome])

        async def settle() -> object:
            record = await self._store.get_execution(caller.agent, execution_id)
            mine = record is not None and record.call_id == attempt.call_id
            if not mine or record is None or record.state is not ExecutionState.INVOKING:
                return await owed_refusal()
            return await write_settled(settle_step)

        return settle

    async def _finish(
        self,
        caller: Caller,
        attempt: _Attempt,
        scope: EvidenceScope,
        state: ExecutionState,
        *,
        reason: str | None,
        result_digest: str | None = None,
    ) -> None:
        execution_id = attempt.envelope.execution_id
        detail = {"result_digest": result_digest} if result_digest else None
        outcome = (
            AuditEvent(state.value),
            {**attempt.fields(), "outcome": state.value, "reason": reason, "detail": detail},
        )
        if execution_id is None:
            await self._write_batch(scope, attempt, [outcome], durable=False)
            return
        # The terminal state and the entries that record it: one transaction (store/base.py
        # ExecutionStep), so a crash leaves both or neither, never a terminal row unaudited.
        batch = [*attempt.pending, outcome]
        attempt.pending = []
        step = ExecutionStep(caller.agent, execution_id, state)
        try:
            entries = await scope.record_many(batch, durable=False, step=step)
        except StaleEpoch as exc:
            # Superseded: recovery owns this execution. What this worker saw is not lost: it is
            # recorded by a fresh, current writer (workers/late_write.py). Entries queued under
            # the stale epoch could never be written; the report replaces them.
            worker, epoch = self._membership.credentials()
            await self._report_late_write(caller, attempt, scope, state, worker, epoch)
            raise StaleEpoch(exc.message, observed_outcome=state.value, execution_id=execution_id) from exc
        except StoreError as exc:
            # Not durable: the row stays invoking (refused) until storage returns; then this
            # worker makes the outcome it observed durable under its own epoch (issue #23).
            refusal = (
                AuditEvent.REFUSED,
                {**attempt.fields(), "reason": "terminal_write_failed", "outcome": state.value},
            )
            self._health.failed(
                exc, owed=self._owed_terminal(caller, attempt, scope, step, batch[:-1], refusal, batch[-1])
            )
            raise NotDurable(
                "The outcome could not be made durable; this execution_id stays refused",
                observed_outcome=state.value,
                execution_id=execution_id,
            ) from exc
        if entries:
            attempt.last = entries[-1]

    def _owed_terminal(
        self,
        caller: Caller,
        attempt: _Attempt,
        scope: EvidenceScope,
        step: ExecutionStep,
        pending: list[tuple[AuditEvent, dict[str, Any]]],
        refusal: tuple[AuditEvent, dict[str, Any]],
        outcome: tuple[AuditEvent, dict[str, Any]],
    ) -> Callable[[], Awaitable[object]]:
        """The terminal write owed once storage returns (issue #23 point 3), as recovery would make it.

        Run by ``store/health.py`` after its probe write succeeded: the row still ``invoking``
        moves to the outcome this worker observed, under this worker's epoch then, with the
        entries owed and the outcome's entry in one transaction (each marked late). A row already
        terminal (the failed write had landed after all, with its entries) gets the refusal alone; a stale
        epoch (a peer recovered this generation meanwhile) hands the outcome to the late-write
        report, as a superseded worker's would be.
        """
        write_refusal = scope.owe([refusal])
        write_all = scope.owe([*pending, refusal, outcome])

        async def settle() -> object:
            record = await self._store.get_execution(step.agent, step.execution_id)
            if record is None or record.state is not ExecutionState.INVOKING:
                logger.debug("owed terminal write: the row is %s already", record and record.state.value)
                return await write_refusal()
            try:
                written = await write_all(step)
            except StaleEpoch:
                worker, epoch = self._membership.credentials()
                await self._report_late_write(caller, attempt, scope, step.target, worker, epoch)
                return None
            logger.info(
                "owed terminal write made durable",
                extra={"execution_id": step.execution_id, "outcome": step.target.value},
            )
            return written

        return settle

    async def _release(self, caller: Caller, attempt: _Attempt, scope: EvidenceScope) -> None:
        assert attempt.envelope.execution_id is not None
        worker, epoch = self._membership.credentials()
        try:
            await self._store.release_execution(
                caller.agent, attempt.envelope.execution_id, worker=worker, epoch=epoch
            )
        except StoreError as exc:
            self._health.failed(exc, owed=self._owed_refusal(scope, attempt, exc))
            raise
        await self._record(scope, attempt, AuditEvent.RELEASED, outcome=ExecutionState.RELEASED.value)

    def _check_attachment(self, caller: Caller, snapshot: Snapshot, required: frozenset[str]) -> None:
        """Raises the typed attachment condition (``required_namespace_not_connected``, ...)."""
        transport_session = caller.transport_session
        if transport_session is not None:
            ref = transport_session_ref(transport_session.id)
            listed = transport_session.surface_namespaces
        else:
            ref = sessionless_ref(caller.agent, caller.principal.agent_session_id)
            listed = None
        if listed is None:
            # Never listed (or sessionless): the surface is what this principal's tools/list would show.
            visible = visible_tools(snapshot, caller.principal, self._fleet.catalog.values())
            listed = frozenset(entry.namespace for entry in visible)
            owner = caller.principal if transport_session is None else None
            self._attachments.surface_listed(ref, listed, owner=owner)
        self._attachments.check(ref, required, tool_read_only=False)

    def _queue(self, scope: EvidenceScope, attempt: _Attempt, event: AuditEvent, **extra: Any) -> None:
        """Queue an entry of this attempt; the next :meth:`_record` writes it first, in order.

        Stamped now, the time of its event, whenever it is written (``recorder.EVENT_AT``).
        """
        attempt.pending.append((event, {**attempt.fields(), EVENT_AT: scope.now(), **extra}))

    async def _record_pending(self, scope: EvidenceScope, attempt: _Attempt) -> None:
        """Write the queued entries now, durably: the send follows (raises ``NotDurable``, and
        then nothing was sent: the entries and the refusal are owed to the audit)."""
        batch, attempt.pending = attempt.pending, []
        try:
            # One more entry of this call follows (its outcome): it stays in this chain.
            entries = await scope.record_many(batch, durable=True, then=1)
        except StaleEpoch:
            raise  # superseded, not a storage failure: nothing is owed under a stale epoch
        except StoreError as exc:
            self._health.failed(exc, owed=scope.owe([*batch, self._refusal(attempt, exc)]))
            raise NotDurable("The admitted entry could not be made durable; the call was not sent") from exc
        if entries:
            attempt.last = entries[-1]

    async def _record(self, scope: EvidenceScope, attempt: _Attempt, event: AuditEvent, **extra: Any) -> None:
        """Write the queued entries and this one in one go (raises ``NotDurable``).

        Durable before the answer: every scope writes now (a sessionless request's too, into
        the chain its agent session shares at this gateway, ``audit/shared.py``).
        """
        await self._write_batch(scope, attempt, [(event, {**attempt.fields(), **extra})], durable=False)

    async def _write_batch(
        self,
        scope: EvidenceScope,
        attempt: _Attempt,
        extra: list[tuple[AuditEvent, dict[str, Any]]],
        *,
        durable: bool,
        then: int = 0,
        step: ExecutionStep | None = None,
    ) -> None:
        batch = [*attempt.pending, *extra]
        attempt.pending = []
        try:
            entries = await scope.record_many(batch, durable=durable, then=then, step=step)
        except StaleEpoch:
            raise  # superseded, not a storage failure: nothing is owed under a stale epoch
        except StoreError as exc:
            self._health.failed(exc, owed=scope.owe(batch))
            raise NotDurable("The audit entry could not be made durable") from exc
        if entries:
            attempt.last = entries[-1]

    async def _audit_refusal(
        self,
        scope: EvidenceScope,
        attempt: _Attempt,
        exc: BastionError,
        *,
        event: AuditEvent = AuditEvent.REFUSED,
        outcome: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        exc.data["audited"] = True
        attempt.refusal_reason = exc.reason.value
        with contextlib.suppress(NotDurable):  # owed to the audit; the refusal itself stands
            await self._record(
                scope,
                attempt,
                event,
                decision=Decision.DENY.value,
                reason=exc.reason.value,
                outcome=outcome,
                detail=detail,
            )

    @staticmethod
    def _refusal(attempt: _Attempt, exc: BastionError) -> tuple[AuditEvent, dict[str, Any]]:
        """The refused entry of ``attempt``, for a refusal owed to the audit."""
        return (
            AuditEvent.REFUSED,
            {**attempt.fields(), "decision": Decision.DENY.value, "reason": exc.reason.value},
        )

    def _owed_refusal(
        self, scope: EvidenceScope, attempt: _Attempt, exc: StoreError
    ) -> Callable[[], Awaitable[object]] | None:
        """The refusal owed when a store write fails; none for a stale epoch (a superseded writer
        can never write it: recording that belongs to the current holder)."""
        if isinstance(exc, StaleEpoch):
            return None
        return scope.owe([*attempt.pending, self._refusal(attempt, exc)])

    async def _report_late_write(
        self,
        caller: Caller,
        attempt: _Attempt,
        scope: EvidenceScope,
        state: ExecutionState,
        worker: WorkerId,
        epoch: Epoch,
    ) -> None:
        """Hand what this superseded worker observed to the late-write report; never raises."""
        if self._on_late_write is None:
            return
        fields = {k: v for k, v in attempt.fields().items() if k not in ("call_id", "execution_id")}
        late = LateWrite(
            agent=caller.agent,
            call_id=attempt.call_id,
            execution_id=attempt.envelope.execution_id,
            observed_outcome=state.value,
            stale_worker=worker,
            stale_epoch=epoch,
            generation=self._membership.generation,
            evidence_session_id=scope.session_id,
            fields=fields,
        )
        with anyio.CancelScope(shield=True), anyio.move_on_after(_LATE_WRITE_REPORT_S):
            try:
                await self._on_late_write(late)
            except Exception:  # the refusal stands whether or not the report could be written
                logger.exception("the late-write report could not be written")

    def _receipt(self, scope: EvidenceScope, attempt: _Attempt) -> dict[str, Any]:
        # The chain the call's last entry went to (a shared chain may have rotated since): its
        # claim is at /sessions/{evidence_session_id}/trace-claim once that chain closes.
        last = attempt.last
        return {
            "evidence_session_id": last.session_id if last else scope.session_id,
            "call_id": attempt.call_id,
            "execution_id": attempt.envelope.execution_id,
            "seq": last.seq if last else None,
            "entry_hash": last.hash if last else None,
        }

    @staticmethod
    def _upstream_params(
        entry: ToolEntry, params: dict[str, Any], arguments: dict[str, Any]
    ) -> dict[str, Any]:
        # A task augmentation stops here: relayed (re-made) only where tasks/relay.py says (issue 24).
        relayed = {k: v for k, v in params.items() if k not in ("name", "arguments", TASK_PARAM)}
        out = strip_reserved_meta(relayed)
        out["name"] = entry.upstream_name
        out["arguments"] = arguments
        return out


def _describe_span(span: Span, caller: Caller, attempt: _Attempt, outcome: str, reason: str) -> None:
    """A call's span attributes (OTel semantic conventions for MCP where they exist): names and
    ids only, never an argument, a result or a credential."""
    entry, last = attempt.entry, attempt.last
    tool = entry.exposed_name if entry else UNKNOWN_TOOL
    span.update_name(f"tools/call {tool}")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "bastion.agent": str(caller.agent),
        "bastion.call_id": attempt.call_id,
    }
    if entry is not None:
        attributes["bastion.server"] = entry.server
    if attempt.envelope.execution_id is not None:
        attributes["bastion.execution_id"] = attempt.envelope.execution_id
    if last is not None:
        attributes["bastion.evidence_session_id"] = last.session_id
        attributes["bastion.evidence_seq"] = last.seq
    set_outcome(span, outcome, reason, attributes)  # one set_attributes: one lock, not nine


def _with_receipt_meta(exc: UpstreamReplied, receipt: dict[str, Any]) -> UpstreamReplied:
    error = dict(exc.error)
    data = error.get("data")
    error["data"] = (
        {**data, "receipt": receipt}
        if isinstance(data, dict)
        else {"upstream_data": data, "receipt": receipt}
    )
    return UpstreamReplied(error)
