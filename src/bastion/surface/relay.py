"""What the resources, prompts and completion paths share (issue 9).

Owns the upstream context of one request made for one caller (its own upstream
session, its log level, its relay) and the one audit entry each read, get or
completion leaves: the decision, the target's name, digests of the parameters and of
the result, never their contents (DESIGN section 4).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bastion.admission.binding import bind_call
from bastion.admission.rounds import RoundCall, RoundStates
from bastion.audit.entry import AuditEvent, Decision, digest_json
from bastion.caller import Caller
from bastion.errors import (
    BastionError,
    CallRefused,
    GrantDenied,
    NotDurable,
    RateLimited,
    StaleEpoch,
    StoreError,
    UnknownResource,
    UpstreamError,
)
from bastion.ids import new_call_id
from bastion.policy.decide import GrantDecision, SurfaceKind, decide_surface
from bastion.policy.snapshot import Snapshot
from bastion.surface.limits import SurfaceLimits
from bastion.surface.uris import UriTarget, resolve_uri
from bastion.upstream.base import CallContext, Upstream, UpstreamReplied
from bastion.upstream.fleet import UpstreamFleet
from bastion.wire_value import wire_problem

__all__ = [
    "AccessRecord",
    "decide_resource",
    "run_recorded",
    "send_in_rounds",
    "send_recorded",
    "server_of_uri",
    "upstream_context",
]


def upstream_context(caller: Caller, snapshot: Snapshot, server: str) -> CallContext:
    """The context of one request sent upstream for ``caller`` (never shared with another client)."""
    return CallContext(
        relay=caller.relay,
        client_capabilities=caller.client_capabilities,
        upstream_sessions=caller.transport_session.upstream_sessions if caller.transport_session else None,
        timeout_s=snapshot.servers[server].timeout_s or snapshot.gateway.upstream_timeout_s,
        log_level=caller.log_level,
        client_answers_requests=caller.transport_session is not None,
        owner=caller.agent,
        owner_ref=caller.owner_ref,
        agent_session_id=caller.principal.agent_session_id,
    )


class AccessRecord:
    """The audit entry of one read, get or completion: written once, before the answer."""

    def __init__(self, caller: Caller, method: str, params: dict[str, Any], snapshot: Snapshot) -> None:
        self._caller = caller
        self._snapshot = snapshot
        self._params = {k: v for k, v in params.items() if k != "_meta"}
        self._contents = False  # the server's audit_contents opt-in, known once the target is
        self.call_id = new_call_id()
        self._fields: dict[str, Any] = {
            "call_id": self.call_id,
            "workflow_id": None,
            "execution_id": None,
            "server": None,
            "tool": None,
            "args_digest": digest_json(self._params),
            "binding": None,
            "policy_version": snapshot.version,
        }
        self.method = method
        self.agent = str(caller.agent)

    def target(self, server: str, name: str) -> None:
        """What the request is about: the server and the upstream URI, template or prompt name."""
        self._fields["server"] = server
        self._fields["tool"] = name
        spec = self._snapshot.servers.get(server)
        self._contents = spec is not None and spec.audit_contents

    async def charge(self, limits: SurfaceLimits | None, decision: GrantDecision) -> None:
        """Take the decision's rate-limit tokens, keyed by this method.

        Raises:
            RateLimited: a bucket is empty (audited as this request's refusal).
        """
        if limits is None:
            return
        try:
            await limits.take(
                decision, str(self._caller.principal.agent), self._fields["server"], self.method
            )
        except RateLimited as exc:
            await self.refused(exc)
            raise

    async def refused(self, exc: BastionError, *, cause: str | None = None) -> None:
        await self._write(
            AuditEvent.REFUSED, decision=Decision.DENY.value, reason=exc.reason.value, cause=cause
        )

    async def failed(self, reason: str) -> None:
        await self._write(AuditEvent.FAILED, decision=Decision.ALLOW.value, outcome="failed", reason=reason)

    async def completed(self, result: dict[str, Any]) -> None:
        await self._write(
            AuditEvent.COMPLETED,
            decision=Decision.ALLOW.value,
            outcome="completed",
            result=result,
        )

    async def _write(
        self,
        event: AuditEvent,
        *,
        result: dict[str, Any] | None = None,
        cause: str | None = None,
        **extra: Any,
    ) -> None:
        detail: dict[str, Any] = {"method": self.method}
        if cause is not None:
            detail["cause"] = cause  # the real cause of a refusal answered alike (admission/rounds.py)
        if result is not None:
            detail["result_digest"] = digest_json(result)
        if self._contents:
            # The server opted in (``audit_contents``): the request and the answer themselves, where
            # they have a canonical form; otherwise the digests stand alone and the entry says why.
            for key, value in (("params", self._params), ("result", result)):
                if value is None:
                    continue
                problem = wire_problem(value)
                if problem is None:
                    detail[key] = value
                else:
                    detail[f"{key}_left_out"] = problem
        scope = self._caller.evidence
        try:
            await scope.record_many([(event, {**self._fields, **extra, "detail": detail})], durable=False)
        except StaleEpoch:
            raise
        except StoreError as exc:
            raise NotDurable("The audit entry could not be made durable") from exc
        finally:
            scope.end_call(self.call_id)


def server_of_uri(fleet: UpstreamFleet, target: UriTarget | None) -> str | None:
    """The server an exposed URI routes to, if one is configured and declared resources."""
    if target is None:
        return None
    server = (
        fleet.transparent_server()
        if target.namespace is None
        else fleet.server_of_namespace(target.namespace)
    )
    return server if server is not None and fleet.offers(server, "resources") else None


async def decide_resource(
    fleet: UpstreamFleet,
    snapshot: Snapshot,
    caller: Caller,
    uri: str,
    record: AccessRecord,
    limits: SurfaceLimits | None = None,
) -> tuple[str, UriTarget]:
    """(4) The server and upstream URI that ``uri`` routes to, decided for ``caller`` against ``snapshot``,
    and the allowing grants' rate-limit tokens taken.

    Raises:
        UnknownResource: no server serves it, or grants hide it; answered alike, audited with the
            real reason (``grant_denied`` for a hidden one).
        RateLimited: an allowing grant's rate limit is spent (audited).
    """
    target = resolve_uri(uri)
    server = server_of_uri(fleet, target)
    unknown = UnknownResource(f"Resource not found: {uri}", uri=uri)
    if target is None or server is None:
        await record.refused(unknown)
        raise unknown
    record.target(server, target.uri)
    namespace = fleet.upstreams[server].namespace
    try:
        decision = decide_surface(
            snapshot, caller.principal, SurfaceKind.RESOURCE, server, namespace, target.uri
        )
    except GrantDenied as exc:
        await record.refused(exc)
        raise unknown from None
    await record.charge(limits, decision)
    return server, target


async def send_recorded(
    record: AccessRecord, upstream: Upstream, method: str, request: dict[str, Any], ctx: CallContext
) -> dict[str, Any]:
    """(7) Send, and (8) write the entry before the answer, whichever way it ends.

    Raises:
        UpstreamReplied: relayed verbatim (recorded ``failed``).
        UpstreamError: the upstream failed (recorded ``failed``).
    """
    return await run_recorded(record, lambda: upstream.call(method, request, ctx))


async def send_in_rounds(
    record: AccessRecord,
    rounds: RoundStates,
    server: str,
    target: str,
    arguments: dict[str, Any],
    upstream: Upstream,
    request: dict[str, Any],
    ctx: CallContext,
) -> dict[str, Any]:
    """:func:`send_recorded`, with the request's ``requestState`` bound to its call (issue #22).

    A ``prompts/get`` or ``resources/read`` may be answered ``input_required`` as a tool call may:
    the token the client is given continues only this agent's same request to the same
    ``target`` with the same ``arguments`` (``admission/rounds.py``).

    Raises:
        InputRoundUnknown: the request names a ``requestState`` not issued here for this agent (audited).
        InputRoundMismatch: the caller's token, issued for another request (audited).
        UpstreamReplied, UpstreamError: as :func:`send_recorded`.
    """
    binding, _ = bind_call(server, target, arguments)
    call = RoundCall(record.agent, record.method, server, target, binding)
    try:
        upstream_state = rounds.take(call, request)
    except CallRefused as exc:
        await record.refused(exc, cause=exc.cause)
        raise
    if upstream_state is not None:
        request = {**request, "requestState": upstream_state}

    async def send() -> dict[str, Any]:
        return rounds.wrap(call, await upstream.call(record.method, request, ctx))

    return await run_recorded(record, send)


async def run_recorded(record: AccessRecord, send: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """(7) Run ``send``, and (8) write the entry before the answer, whichever way it ends.

    Raises:
        UpstreamReplied: relayed verbatim (recorded ``failed``).
        UpstreamError: the upstream failed (recorded ``failed``).
    """
    try:
        result = await send()
    except UpstreamReplied:
        await record.failed("upstream_error")
        raise
    except UpstreamError as exc:
        await record.failed(exc.reason.value)
        raise
    await record.completed(result)
    return result
