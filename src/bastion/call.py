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
reserve alone (a replay is still classified), then release.
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
from mcp_types import LOG_LEVEL_META_KEY

from bastion.admission.binding import bind_call
from bastion.admission.continuation import InputContinuations
from bastion.admission.envelope import CmcpEnvelope, read_envelope
from bastion.admission.states import ExecutionState
from bastion.audit.earlier import name_earlier_attempt
from bastion.audit.entry import AuditEntry, AuditEvent, Decision
from bastion.audit.scope import EvidenceScope
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
from bastion.param_headers import check_param_headers
from bastion.policy.decide import RateLimiter, decide, visible_tools
from bastion.policy.grants import Rate
from bastion.policy.shared_limits import StoreRateLimiter
from bastion.policy.snapshot import Snapshot
from bastion.settle import send_and_settle
from bastion.store.base import ExecutionStep, Store
from bastion.store.health import StoreHealth
from bastion.surface.limits import SurfaceLimits
from bastion.upstream.base import CallContext, UpstreamReplied
from bastion.upstream.fleet import ToolEntry, UpstreamFleet
from bastion.workers.attachment import AttachmentTracker, owner_ref, sessionless_ref, transport_session_ref
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
    ) -> None:
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
        # Grant rate limits on resources, prompts and completion: the same limiters (issue 9).
        self.surface_limits = SurfaceLimits(limiter, shared_limits, monotonic)

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
            raise UnknownTool(f"Unknown tool: {name}", tool=name)
        attempt.entry = entry
        try:
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
        assert not (decision.require_execution_id and attempt.envelope.execution_id is None)
        attempt.binding, attempt.args_digest = bind_call(entry.server, entry.upstream_name, arguments)
        # (5) Attachment gate: a mutating tool is refused while a namespace this agent or team
        #     requires is not connected, not in the session's surface, or contradicts itself.
        required = snapshot.requirements.required_for(caller.agent, caller.principal.team)
        if required and not entry.read_only:
            self._check_attachment(caller, snapshot, required)

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
            self._queue(attempt, AuditEvent.ADMITTED, decision=Decision.ALLOW.value)
            await self._release(caller, attempt, scope)
            raise UpstreamUnavailable(f"upstream {entry.server} is not connected")
        self._queue(attempt, AuditEvent.ADMITTED, decision=Decision.ALLOW.value)
        if execution_id is not None and continuation is None:
            # The reservation, the durable "invoking" mark and the audit entries that say so: one
            # transaction (store/base.py ExecutionStep), durable before the send.
            self._queue(attempt, AuditEvent.INVOKING)
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
            with anyio.CancelScope(shield=True):
                await self._admit(caller, attempt, scope, execution_id, step=step)

        # Without an execution id there is no state to move: the admitted entry is written with
        # the outcome, durably, before the answer (DESIGN section 2 step 8).
        async def send() -> dict[str, Any]:
            ctx = CallContext(
                relay=caller.relay,
                client_capabilities=caller.client_capabilities,
                progress_token=_progress_token(params),
                upstream_sessions=caller.transport_session.upstream_sessions
                if caller.transport_session
                else None,
                timeout_s=snapshot.servers[entry.server].timeout_s or snapshot.gateway.upstream_timeout_s,
                log_level=caller.log_level or _requested_log_level(params),
                client_answers_requests=caller.transport_session is not None,
                owner=caller.agent,
                owner_ref=owner_ref(
                    caller.transport_session.id if caller.transport_session else None,
                    caller.agent,
                    caller.principal.agent_session_id,
                ),
                agent_session_id=caller.principal.agent_session_id,
            )
            return await upstream.call("tools/call", self._upstream_params(entry, params, arguments), ctx)

        async def finish(
            state: ExecutionState, *, reason: str | None, result_digest: str | None = None
        ) -> None:
            await self._finish(caller, attempt, scope, state, reason=reason, result_digest=result_digest)

        async def await_input(result: dict[str, Any]) -> None:
            # Not an outcome: the client is asked for input and comes back with the same call.
            if execution_id is not None and attempt.binding is not None:
                self._continuations.expect(
                    caller.agent, execution_id, attempt.binding, result.get("requestState")
                )
            await self._record(scope, attempt, AuditEvent.INPUT_REQUIRED, reason="input_required")

        # (8) Outcome: from here every way out (result, error, cancellation, garbage) records a
        #     durable terminal state, then its audit entry, then answers (settle.py).
        attempt.sent = True
        try:
            result = await send_and_settle(send, finish, on_input_required=await_input)
        except UpstreamReplied as exc:
            raise _with_receipt_meta(exc, self._receipt(scope, attempt)) from None
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
            # acknowledgement): refused until recovery settles it, never guessed into permission.
            # The refusal that trips degraded mode is owed to the audit like the ones after it.
            self._health.failed(exc, owed=self._owed_refusal(scope, attempt, exc))
            raise

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
            # Not durable: the row stays invoking (refused forever), never terminal by guess.
            owed = [
                *batch[:-1],
                (
                    AuditEvent.REFUSED,
                    {**attempt.fields(), "reason": "terminal_write_failed", "outcome": state.value},
                ),
            ]
            self._health.failed(exc, owed=scope.owe(owed))
            raise NotDurable(
                "The outcome could not be made durable; this execution_id stays refused",
                observed_outcome=state.value,
                execution_id=execution_id,
            ) from exc
        if entries:
            attempt.last = entries[-1]

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

    def _queue(self, attempt: _Attempt, event: AuditEvent, **extra: Any) -> None:
        """Queue an entry of this attempt; the next :meth:`_record` writes it first, in order."""
        attempt.pending.append((event, {**attempt.fields(), **extra}))

    async def _record_pending(
        self, scope: EvidenceScope, attempt: _Attempt, *, step: ExecutionStep | None = None
    ) -> None:
        """Write the queued entries now, durably, with ``step`` if given: something irreversible
        follows (raises ``NotDurable``)."""
        # One more entry of this call follows (its outcome or refusal): it stays in this chain.
        await self._write_batch(scope, attempt, [], durable=True, then=1, step=step)

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
        out = strip_reserved_meta({k: v for k, v in params.items() if k not in ("name", "arguments")})
        out["name"] = entry.upstream_name
        out["arguments"] = arguments
        return out


def _with_receipt_meta(exc: UpstreamReplied, receipt: dict[str, Any]) -> UpstreamReplied:
    error = dict(exc.error)
    data = error.get("data")
    error["data"] = (
        {**data, "receipt": receipt}
        if isinstance(data, dict)
        else {"upstream_data": data, "receipt": receipt}
    )
    return UpstreamReplied(error)


def _requested_log_level(params: dict[str, Any]) -> str | None:
    # A 2026-07-28 client asks for log messages per request, in _meta (there is no logging/setLevel).
    meta = params.get("_meta")
    level = meta.get(LOG_LEVEL_META_KEY) if isinstance(meta, dict) else None
    return level if isinstance(level, str) else None


def _progress_token(params: dict[str, Any]) -> str | int | None:
    meta = params.get("_meta")
    if isinstance(meta, dict):
        token = meta.get("progressToken")
        if isinstance(token, str | int) and not isinstance(token, bool):
            return token
    return None
