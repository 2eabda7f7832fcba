"""The front door: MCP Streamable HTTP at ``/mcp``, both eras (DESIGN sections 0, 2 step 1, 5).

Order of checks for every request, first failure wins, each a typed error:

1. HTTP method (405), ``Host`` (421) and ``Origin`` (403) against DNS rebinding
   (``transport/rebinding.py``); a CORS preflight from an allowed ``Origin`` is
   answered here (204, ``transport/cors.py``); credential (401).
2. POST: ``Content-Type`` (415), ``Accept`` (406), body size (413), JSON (-32700), JSON-RPC shape (-32600).
3. Era, by ``MCP-Protocol-Version`` as the reference servers route. A
   session-era revision, or none, is the session era: ``initialize`` opens a
   transport session; anything else needs ``Mcp-Session-Id`` (400) naming a live
   session of this agent (404, the same for unknown, expired, terminated and
   foreign), and a version header, when present, a supported session-era
   revision (absent or another one means the negotiated one governs). Any other revision is served alone
   after the per-request ladder: header and ``_meta`` agree (400), the revision
   is supported (-32022 with the request's id and ``server/discover``'s list).
   GET resumes or opens a session's event stream (``transport/resume.py``).
4. Dispatch (``methods.py``), on a :class:`ResponseChannel` that belongs to this
   request alone.

This module renders errors; it never decides policy.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, classify_inbound_request
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.call import RECEIPT_META_KEY
from bastion.caller import Caller
from bastion.errors import (
    BastionError,
    HeaderMismatch,
    InvalidParams,
    InvalidRequest,
    MethodNotAllowed,
    NotAcceptable,
    NotDurable,
    RequestRejected,
    SessionIdMissing,
    SessionNotFound,
    TooManySessions,
    UnsupportedMediaType,
    UnsupportedProtocolVersion,
)
from bastion.ids import AgentId
from bastion.methods import SERVER_INFO, MethodRouter, for_sessionless_wire
from bastion.policy.snapshot import Snapshot
from bastion.session.registry import SessionRegistry
from bastion.session.state import InFlightCall, TransportSession
from bastion.tasks.support import task_name_mismatch
from bastion.transport.agent_limits import AgentRequests
from bastion.transport.channel import ResponseChannel
from bastion.transport.cors import CorsSend, preflight
from bastion.transport.forwarded import client_address
from bastion.transport.jsonrpc import (
    Notification,
    Request,
    RequestId,
    Response,
    decode_body,
    error_message,
    parse_message,
    result_message,
)
from bastion.transport.limits import note_authenticated
from bastion.transport.rebinding import check_host_and_origin
from bastion.transport.relay import StreamRelay
from bastion.transport.resume import serve_event_stream
from bastion.transport.single_headers import check_single_headers
from bastion.transport.sse_out import primes
from bastion.transport.wire import accepted, disconnect_cancels, meta_of, prefers_sse, read_body, reject
from bastion.upstream.base import UpstreamReplied
from bastion.versions import (
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_META_KEY,
    SUPPORTED_VERSIONS,
)

__all__ = ["FrontDoor", "ReplicaSessions"]

logger = logging.getLogger(__name__)

SessionClosed = Callable[[TransportSession, str], Awaitable[None]]


class ReplicaSessions(Protocol):
    """How the front door reaches sessions and requests held at other replicas (issue #10)."""

    async def record_opened(self, transport_session: TransportSession) -> None: ...
    async def load(self, session_id: str, principal: Principal) -> TransportSession: ...
    async def forward_cancel(self, transport_session: TransportSession, request_id: RequestId) -> None: ...
    async def forward_reply(
        self, transport_session: TransportSession, relay_id: str, reply: dict[str, Any]
    ) -> None: ...


class FrontDoor:
    """The ASGI application behind ``/mcp``."""

    def __init__(
        self,
        *,
        snapshot: Callable[[], Snapshot],
        authenticate: Callable[[Scope, str | None], Awaitable[Principal]],
        challenge: Callable[[bool], str],
        registry: SessionRegistry,
        router: MethodRouter,
        close_session: SessionClosed,
        evidence_for: Callable[[AgentId], EvidenceScope],
        request_evidence_for: Callable[[Principal], EvidenceScope],
        end_request_evidence: Callable[[EvidenceScope], None],
        audit_isolation: Callable[[AgentId, str, str], Awaitable[None]],
        serving: Callable[[], None],
        track_sessionless: Callable[[Principal, anyio.CancelScope], contextlib.AbstractContextManager[None]],
        replicas: ReplicaSessions | None = None,
        cut_cause: Callable[[Principal], BastionError | None] = lambda principal: None,
        client_notified: Callable[[TransportSession, str], None] | None = None,
    ) -> None:
        self._replicas = replicas
        self._cut_cause = cut_cause
        self._client_notified = client_notified
        self._track_sessionless = track_sessionless
        self._snapshot = snapshot
        self._authenticate = authenticate
        self._challenge = challenge
        self._registry = registry
        self._router = router
        self._close_session = close_session
        self._evidence_for = evidence_for
        self._request_evidence_for = request_evidence_for
        self._end_request_evidence = end_request_evidence
        self._audit_isolation = audit_isolation
        self._serving = serving
        self.agent_requests = AgentRequests()  # after authentication the caps are per agent (#22)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        cors = CorsSend(send)
        try:
            check_single_headers(scope)  # before anything reads them (issue #22)
            await self._serve(scope, receive, cors, headers)
        except RequestRejected as exc:
            await reject(cors, exc, None)

    async def _serve(self, scope: Scope, receive: Receive, send: CorsSend, headers: Headers) -> None:
        # (1) method, origin, credential
        self._serving()  # a superseded worker stops serving (raises)
        method = scope["method"]
        if method not in ("POST", "GET", "DELETE", "OPTIONS"):
            raise MethodNotAllowed()
        snapshot = self._snapshot()
        settings = snapshot.gateway
        try:
            check_host_and_origin(scope, headers, settings.allowed_hosts, settings.allowed_origins)
        except RequestRejected as exc:
            await self._audit_misdirected(scope, headers, exc)
            raise
        origin = headers.get("origin")
        if method == "OPTIONS":
            if origin is None:
                raise MethodNotAllowed()  # not a CORS preflight
            await preflight(send, origin, headers.get("access-control-request-headers"))
            return
        send.allow(origin)  # an allowed Origin: every answer from here on names it
        try:
            principal = await self._authenticate(scope, headers.get("authorization"))
        except RequestRejected as exc:
            presented = "authorization" in headers or b"token=" in scope.get("query_string", b"")
            await reject(send, exc, None, challenge=self._challenge(presented))
            return
        # A request that authenticated: its connection leaves the pre-authentication pool of its
        # address, and it counts against its agent's cap instead (transport/limits.py, #22).
        note_authenticated(scope)
        client = client_address(scope, snapshot.auth.mtls_trusted_proxies)
        with self.agent_requests.hold(principal.agent, settings.max_requests_per_agent, client=client):
            await self._serve_authenticated(scope, receive, send, headers, principal, snapshot)

    async def _serve_authenticated(
        self,
        scope: Scope,
        receive: Receive,
        send: CorsSend,
        headers: Headers,
        principal: Principal,
        snapshot: Snapshot,
    ) -> None:
        method = scope["method"]
        version_header = headers.get("mcp-protocol-version")
        if method == "POST":
            await self._post(scope, receive, send, headers, principal, snapshot)
            return
        if version_header in MODERN_VERSIONS:
            raise MethodNotAllowed("Method Not Allowed: the sessionless era has no GET stream or DELETE")
        transport_session = await self._session_for(headers, principal)
        if method == "DELETE":
            await self._close_session(transport_session, "client_delete")
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await self._get_stream(receive, send, headers, transport_session)

    async def _audit_misdirected(self, scope: Scope, headers: Headers, refusal: RequestRejected) -> None:
        """Audit a valid credential sent with a foreign Host or Origin (a rebinding page, a leaked token)."""
        logger.info("request refused before authentication", extra={"reason": refusal.reason.value})
        if "authorization" not in headers:
            return  # nobody to attribute it to
        try:
            principal = await self._authenticate(scope, headers.get("authorization"))
        except RequestRejected:
            return
        await self._audit_isolation(principal.agent, refusal.cause or "", refusal.reason.value)

    # ------------------------------------------------------------------ POST

    async def _post(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: Headers,
        principal: Principal,
        snapshot: Snapshot,
    ) -> None:
        # (2) media types, size, JSON, JSON-RPC
        if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise UnsupportedMediaType()
        accept = headers.get("accept", "")
        if "application/json" not in accept and "*/*" not in accept:
            raise NotAcceptable()
        sse_allowed = "text/event-stream" in accept or "*/*" in accept
        body = await read_body(receive, headers, snapshot.gateway.max_body_bytes)
        decoded = decode_body(body)
        message = parse_message(decoded)
        version_header = headers.get("mcp-protocol-version")

        # (3) era, by the version header as the reference servers route: a session-era revision
        # (or none) is the session era; anything else, unknown revisions included, takes the
        # per-request ladder, which answers an unknown revision with -32022 and the request's id.
        if version_header is not None and version_header not in HANDSHAKE_VERSIONS:
            await self._post_sessionless(receive, send, headers, principal, message, decoded, sse_allowed)
            return
        if isinstance(message, Request) and message.method == "initialize":
            await self._initialize(send, message, principal)
            return
        transport_session = await self._session_for(headers, principal)
        # A missing header, or another session-era revision, is served at the negotiated version
        # (DESIGN section 2 step 1, as the reference servers accept it: 0.1.16
        # server-sse-multiple-streams sends 2025-03-26 on a 2025-11-25 session). An unsupported one
        # never reaches here: it took the per-request ladder above and was answered 400.
        if isinstance(message, Notification):
            await self._on_notification(transport_session, message)
            await accepted(send)
            return
        if isinstance(message, Response):
            reply = {"result": message.result} if message.error is None else {"error": message.error}
            pending = transport_session.client_requests.get(str(message.id))
            if pending is not None:
                pending.reply = reply
                pending.done.set()
            elif self._replicas is not None and str(message.id).startswith("bastion-r"):
                # Relayed by another replica serving this session: its answer goes there.
                await self._replicas.forward_reply(transport_session, str(message.id), reply)
            await accepted(send)
            return
        if message.id in transport_session.in_flight:
            raise InvalidRequest("Invalid Request: this request id is already in flight on this session")
        caller = Caller.of_transport_session(transport_session)  # its agent is principal's (get checked)
        prefer_sse = prefers_sse(accept)
        await self._answer(
            receive, send, caller, message, sse_allowed, cancel_on_disconnect=False, prefer_sse=prefer_sse
        )

    async def _post_sessionless(
        self,
        receive: Receive,
        send: Send,
        headers: Headers,
        principal: Principal,
        message: Request | Notification | Response,
        decoded: dict[str, Any],
        sse_allowed: bool,
    ) -> None:
        requested = headers.get("mcp-protocol-version", "")
        if isinstance(message, Notification):
            # No client-to-server notifications on this wire (closing the stream cancels); one at a
            # revision not served is told so, as a request is.
            if requested not in MODERN_VERSIONS:
                raise UnsupportedProtocolVersion(supported=list(SUPPORTED_VERSIONS), requested=requested)
            await accepted(send)
            return
        if isinstance(message, Response):
            raise InvalidRequest("Invalid Request: the sessionless era has no back channel to answer")
        if message.method == "subscriptions/listen" and not sse_allowed:
            raise NotAcceptable("Not Acceptable: a listen stream needs Accept: text/event-stream")
        if requested not in MODERN_VERSIONS and PROTOCOL_VERSION_META_KEY not in meta_of(decoded):
            # No per-request envelope to check the header against: the revision itself is the answer.
            unsupported = UnsupportedProtocolVersion(supported=list(SUPPORTED_VERSIONS), requested=requested)
            await reject(send, unsupported, message.id)
            return
        verdict = classify_inbound_request(
            decoded, headers=dict(headers.items()), supported_modern_versions=SUPPORTED_VERSIONS
        )
        if not hasattr(verdict, "protocol_version"):
            code = getattr(verdict, "code", -32600)
            error: BastionError
            if code == -32022:
                error = UnsupportedProtocolVersion(**(getattr(verdict, "data", None) or {}))
            elif code == -32020:
                error = HeaderMismatch(getattr(verdict, "message", None))
            else:
                error = InvalidParams(getattr(verdict, "message", None))
            await reject(send, error, message.id, status=ERROR_CODE_HTTP_STATUS.get(code, 400))
            return
        mismatch = task_name_mismatch(message.method, decoded.get("params"), headers.get("mcp-name"))
        if mismatch is not None:
            await reject(send, HeaderMismatch(mismatch), message.id, status=400)
            return
        capabilities = getattr(verdict, "client_capabilities", None)
        # The evidence session this agent session's sessionless requests share (``audit/shared.py``).
        evidence = self._request_evidence_for(principal)
        caller = Caller(
            agent=principal.agent,
            principal=principal,
            protocol_version=getattr(verdict, "protocol_version", MODERN_VERSIONS[-1]),
            client_capabilities=capabilities if isinstance(capabilities, dict) else {},
            transport_session=None,
            relay=None,
            evidence=evidence,
            param_headers=Headers(
                raw=[(k, v) for k, v in headers.raw if k.lower().startswith(b"mcp-param-")]
            ),
        )
        try:
            # Its entries are durable before its answer; the claim follows when the chain closes.
            await self._answer(
                receive,
                send,
                caller,
                message,
                sse_allowed,
                cancel_on_disconnect=True,
                prefer_sse=prefers_sse(headers.get("accept", "")),
            )
        finally:
            self._end_request_evidence(evidence)  # plain bookkeeping: no await, nothing to shield

    async def _answer(
        self,
        receive: Receive,
        send: Send,
        caller: Caller,
        request: Request,
        sse_allowed: bool,
        *,
        cancel_on_disconnect: bool,
        before_finish: Callable[[], Awaitable[None]] | None = None,
        prefer_sse: bool = False,
    ) -> None:
        """Dispatch one request and write its answer to its own channel only."""
        transport_session = caller.transport_session
        channel = ResponseChannel(
            send,
            sse_allowed=sse_allowed,
            open_stream=None if transport_session is None else transport_session.streams.open_response_stream,
            priming=transport_session is not None and primes(transport_session.protocol_version),
            prefer_sse=prefer_sse,
        )
        caller = caller.with_relay(StreamRelay(channel, transport_session))
        sessionless = transport_session is None
        in_flight: InFlightCall | None = None
        with anyio.CancelScope() as call_scope:
            if transport_session is not None:
                in_flight = InFlightCall(request.id, request.method, call_scope)
                transport_session.in_flight[request.id] = in_flight
            try:
                # A slow answer keeps the client's read timeout from firing (SSE comments, #22).
                with channel.kept_alive(self._snapshot().gateway.sse_keepalive_s):
                    if cancel_on_disconnect:
                        # Sessionless era: closing the request's stream cancels the request, and so
                        # does revoking its agent session.
                        with (
                            self._track_sessionless(caller.principal, call_scope),
                            disconnect_cancels(receive, call_scope),
                        ):
                            reply, status = await self._dispatch(caller, request, sessionless)
                    else:
                        reply, status = await self._dispatch(caller, request, sessionless)
                if before_finish is not None:
                    with anyio.CancelScope(shield=True):
                        try:
                            await before_finish()
                        except BastionError:
                            # The evidence could not be made durable: no answer may claim success.
                            # (An error answer already claims none, and says more: keep it.)
                            if "result" in reply:
                                meta = reply["result"].get("_meta") or {}
                                reply = error_message(
                                    request.id,
                                    NotDurable(
                                        "The audit could not be made durable",
                                        receipt=meta.get(RECEIPT_META_KEY),
                                    ),
                                )
                                status = 200
                await channel.finish(reply, status)
            finally:
                if transport_session is not None:
                    transport_session.in_flight.pop(request.id, None)
                if in_flight is not None:
                    in_flight.done.set()
        if call_scope.cancelled_caught:
            cut = self._cut_cause(caller.principal)
            if cut is None:
                await channel.end_empty()
            else:
                # Cut by the gateway (revocation), not by the client: a typed answer, not silence.
                await channel.finish(error_message(request.id, cut))

    async def _dispatch(
        self, caller: Caller, request: Request, sessionless: bool
    ) -> tuple[dict[str, Any], int]:
        try:
            result = await self._router.dispatch(caller, request.method, request.params, request.id)
        except BastionError as exc:
            reply = error_message(request.id, exc)
            status = exc.http_status if isinstance(exc, RequestRejected) else 200
            if sessionless and status == 200:
                status = ERROR_CODE_HTTP_STATUS.get(exc.jsonrpc_code, 200)
            return reply, status
        except UpstreamReplied as exc:
            # Relayed verbatim; on the 2026 wire its HTTP status is the one the spec maps its code
            # to (-32020/-32021/-32022/-32602 are 400, -32601 is 404), as if the upstream were direct.
            code = exc.error.get("code")
            status = ERROR_CODE_HTTP_STATUS.get(code, 200) if sessionless and isinstance(code, int) else 200
            return error_message(request.id, exc.error), status
        if sessionless:
            result = for_sessionless_wire(request.method, result)
        return result_message(request.id, result), 200

    async def _on_notification(self, transport_session: TransportSession, message: Notification) -> None:
        if message.method == "notifications/cancelled":
            request_id = message.params.get("requestId")
            if not isinstance(request_id, str | int):
                return
            call = transport_session.in_flight.get(request_id)
            if call is not None and call.method != "initialize":
                call.cancel_scope.cancel()
            elif call is None and self._replicas is not None:
                # The request may be in flight at another replica serving this session.
                await self._replicas.forward_cancel(transport_session, request_id)
        elif message.method == "notifications/roots/list_changed" and self._client_notified is not None:
            self._client_notified(transport_session, message.method)

    # ------------------------------------------------------------------ session era

    async def _session_for(self, headers: Headers, principal: Principal) -> TransportSession:
        session_id = headers.get("mcp-session-id")
        if not session_id:
            raise SessionIdMissing()
        try:
            try:
                return self._registry.get(session_id, principal)
            except SessionNotFound as exc:
                if exc.cause != "unknown" or self._replicas is None:
                    raise
                # Not held here: opened at (or served by) another replica; the store decides (#10).
                return await self._replicas.load(session_id, principal)
        except SessionNotFound as exc:
            # Unknown, expired, terminated or another principal's: one answer after the same work
            # (one audit entry naming the cause), so neither body nor timing tells them apart (#12).
            await self._audit_isolation(
                principal.agent, f"{exc.cause or 'unknown'}_session_id", exc.reason.value
            )
            raise

    async def _initialize(self, send: Send, request: Request, principal: Principal) -> None:
        params = request.params
        requested = params.get("protocolVersion")
        capabilities = params.get("capabilities", {})
        client_info = params.get("clientInfo", {})
        if (
            not isinstance(requested, str)
            or not isinstance(capabilities, dict)
            or not isinstance(client_info, dict)
        ):
            error = InvalidParams(
                "Invalid params: initialize needs protocolVersion, capabilities and clientInfo"
            )
            await reject(send, error, request.id, status=400)
            return
        if self._registry.at_capacity():
            raise TooManySessions()
        negotiated = requested if requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE_VERSION
        transport_session = self._registry.create(
            principal, negotiated, capabilities, client_info, self._evidence_for(principal.agent)
        )
        if self._replicas is not None:
            # Durable before the client learns the id, so any replica can serve it (raises if not).
            await self._replicas.record_opened(transport_session)
        result = {
            "protocolVersion": negotiated,
            "capabilities": self._router.capabilities_for(principal, negotiated),
            "serverInfo": SERVER_INFO,
            "instructions": "Bastion gateway: one governed surface over several MCP servers.",
        }
        channel = ResponseChannel(send, sse_allowed=False, headers={"mcp-session-id": transport_session.id})
        await channel.finish(result_message(request.id, result))

    async def _get_stream(
        self, receive: Receive, send: Send, headers: Headers, transport_session: TransportSession
    ) -> None:
        if "text/event-stream" not in headers.get("accept", ""):
            raise NotAcceptable("Not Acceptable: the GET stream needs Accept: text/event-stream")
        version_header = headers.get("mcp-protocol-version")
        if version_header is not None and version_header not in HANDSHAKE_VERSIONS:
            # A supported session-era revision is accepted, the negotiated one governs (as on POST).
            raise UnsupportedProtocolVersion(supported=list(SUPPORTED_VERSIONS), requested=version_header)
        await serve_event_stream(receive, send, transport_session, headers.get("last-event-id"))
