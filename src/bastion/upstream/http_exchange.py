"""One request exchange with a Streamable HTTP upstream, in either era (DESIGN section 2 step 7).

Owns the POST and its answer: the headers a request carries (only those configured for this
upstream, never a client's credentials), the JSON or SSE reply read to its final message, a
request the upstream asks on that stream answered, a dropped stream resumed, an abandoned
request cancelled upstream, and httpx failures translated into :class:`UpstreamError`
(``upstream/http_client.py``). What a stream says outside the answer goes to the upstream's
``on_stream_notification``; the exchange never decides where a notification belongs.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any

import anyio
import anyio.abc
from mcp.shared.inbound import encode_header_value, mcp_param_headers

from bastion import __version__
from bastion.errors import (
    OutcomeUnknown,
    UpstreamProtocolError,
    UpstreamResponseTooLarge,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.policy.snapshot import ServerSpec
from bastion.tasks.support import TASK_NAMED_METHODS
from bastion.tracing import inject_headers
from bastion.transport.jsonrpc import dumps
from bastion.upstream.base import CallContext, ClientDeclined, UpstreamReplied
from bastion.upstream.capability_sets import bridged_capabilities
from bastion.upstream.era_paths import with_log_level
from bastion.upstream.failure import describe_failure
from bastion.upstream.http_client import (
    BodyOverLimit,
    ConnectError,
    HttpFailure,
    HttpTimeout,
    UpstreamHttp,
    UpstreamResponse,
)
from bastion.upstream.http_session import HttpUpstreamSession, SessionGone
from bastion.upstream.relay import RequestRelay
from bastion.upstream.resume import Reconnect, messages_resuming
from bastion.upstream.taskgroups import single_exception
from bastion.versions import (
    CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    MODERN_VERSION,
    PROTOCOL_VERSION_META_KEY,
)
from bastion.wire_value import loads_exact

__all__ = ["ACCEPT", "GATEWAY_INFO", "HttpExchange", "StreamNotification", "encode_body"]

ACCEPT = "application/json, text/event-stream"
GATEWAY_INFO = {"name": "bastion", "version": __version__}

# A notification on a request's stream: (method, params, the request's relay, its upstream session).
StreamNotification = Callable[
    [str, dict[str, Any], RequestRelay, HttpUpstreamSession | None], Coroutine[Any, Any, None]
]


def encode_body(message: dict[str, Any]) -> bytes:
    return dumps(message)


class HttpExchange:
    """Sends one request to one upstream and reads its answer."""

    def __init__(
        self,
        spec: ServerSpec,
        client: UpstreamHttp,
        headers: dict[str, str],
        *,
        on_stream_notification: StreamNotification,
    ) -> None:
        assert spec.url is not None
        self.spec = spec
        self.name = spec.name
        self.url = spec.url
        self.headers = headers
        self._client = client
        self._ids = itertools.count(1)
        self._on_stream_notification = on_stream_notification
        # Tool name -> its x-mcp-header parameters, mirrored as Mcp-Param-* headers (tools/list).
        self.param_maps: dict[str, dict[tuple[str, ...], str]] = {}

    def session_headers(self, upstream_session: HttpUpstreamSession) -> dict[str, str]:
        headers = {
            **self.headers,
            "accept": ACCEPT,
            "mcp-protocol-version": upstream_session.protocol_version,
        }
        if upstream_session.session_id is not None:
            headers["mcp-session-id"] = upstream_session.session_id
        return headers

    async def post(
        self, upstream_session: HttpUpstreamSession, method: str, params: dict[str, Any], relay: RequestRelay
    ) -> dict[str, Any]:
        result, _ = await self.post_raw(upstream_session, method, params, relay)
        return result

    async def post_raw(
        self,
        upstream_session: HttpUpstreamSession,
        method: str,
        params: dict[str, Any],
        relay: RequestRelay,
        *,
        initialize: bool = False,
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        request_id = next(self._ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": relay.outbound_params(params)}
        headers = self.session_headers(upstream_session)
        if initialize:
            headers.pop("mcp-protocol-version", None)
        headers["content-type"] = "application/json"
        answered = False
        upstream_session.relays.append(relay)
        try:
            async with self.stream(headers, body) as response:
                if response.status_code == 404 and upstream_session.session_id is not None:
                    raise SessionGone()
                result = await self.read_reply(response, request_id, relay, upstream_session)
                answered = True
                return result, response.headers
        finally:
            upstream_session.relays.remove(relay)
            if not answered and not initialize and method != "initialize":
                # Abandoned (cancelled, timed out or failed): tell the upstream to stop.
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await self.notify_cancelled(upstream_session, request_id)

    async def notify_cancelled(self, upstream_session: HttpUpstreamSession, request_id: int) -> None:
        message = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "cancelled by the client"},
        }
        with contextlib.suppress(HttpFailure):
            await self._client.request(
                "POST",
                self.url,
                headers={**self.session_headers(upstream_session), "content-type": "application/json"},
                content=encode_body(message),
            )

    async def modern_request(
        self,
        method: str,
        params: dict[str, Any],
        relay: RequestRelay | None,
        client_capabilities: Any,
        ctx: CallContext | None = None,
    ) -> dict[str, Any]:
        relay = relay or RequestRelay(None, None)
        request_id = next(self._ids)
        outbound = dict(relay.outbound_params(params))
        meta = dict(outbound.get("_meta") or {})
        meta[PROTOCOL_VERSION_META_KEY] = MODERN_VERSION
        capabilities = bridged_capabilities(client_capabilities)
        asked = meta.get(CAPABILITIES_META_KEY)  # only the gateway's own: clients' are stripped
        if isinstance(asked, dict) and isinstance(asked.get("extensions"), dict):
            capabilities["extensions"] = asked["extensions"]  # the tasks extension, for this request
        meta[CAPABILITIES_META_KEY] = capabilities
        meta[CLIENT_INFO_META_KEY] = GATEWAY_INFO
        outbound["_meta"] = with_log_level(meta, ctx)
        headers = {
            **self.headers,
            "accept": ACCEPT,
            "content-type": "application/json",
            "mcp-protocol-version": MODERN_VERSION,
            "mcp-method": method,
        }
        name = params.get("name") if method in ("tools/call", "prompts/get") else params.get("uri")
        if method in TASK_NAMED_METHODS:
            name = params.get("taskId")  # the tasks extension's routing header
        if isinstance(name, str) and (
            method in ("tools/call", "prompts/get", "resources/read") or method in TASK_NAMED_METHODS
        ):
            headers["mcp-name"] = encode_header_value(name)
        arguments = params.get("arguments")
        if method == "tools/call" and isinstance(name, str) and isinstance(arguments, dict):
            # x-mcp-header parameters are mirrored as Mcp-Param-* headers, as the upstream requires.
            headers.update(mcp_param_headers(self.param_maps.get(name, {}), arguments))
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": outbound}
        # Closing this request's stream is the sessionless era's cancellation.
        async with self.stream(headers, body) as response:
            return await self.read_reply(response, request_id, relay, None)

    @contextlib.asynccontextmanager
    async def stream(self, headers: dict[str, str], body: dict[str, Any]) -> AsyncIterator[UpstreamResponse]:
        inject_headers(headers)  # the gateway's span context, when a call is traced (tracing.py)
        sent = False
        try:
            async with self._client.stream(
                "POST", self.url, headers=headers, content=encode_body(body)
            ) as response:
                sent = True
                yield response
        except HttpFailure as exc:
            if sent:
                raise OutcomeUnknown(f"upstream {self.name}: connection lost ({type(exc).__name__})") from exc
            if isinstance(exc, ConnectError):
                raise UpstreamUnavailable(f"upstream {self.name}: {describe_failure(exc)}") from exc
            if isinstance(exc, HttpTimeout):
                raise UpstreamTimeout(f"upstream {self.name}: {type(exc).__name__}") from exc
            raise OutcomeUnknown(f"upstream {self.name}: {type(exc).__name__}") from exc

    async def read_reply(
        self,
        response: UpstreamResponse,
        request_id: int,
        relay: RequestRelay,
        upstream_session: HttpUpstreamSession | None,
    ) -> dict[str, Any]:
        status = response.status_code
        content_type = response.headers.get("content-type", "")
        if status >= 500:
            raise OutcomeUnknown(f"upstream {self.name} answered HTTP {status}")
        if content_type.startswith("application/json"):
            try:
                raw = await response.aread(self.spec.max_response_bytes)
            except BodyOverLimit as exc:
                # Read no further: leaving the stream closes this connection (http_client.py).
                raise self.too_large("a JSON body") from exc
            try:
                message = loads_exact(raw)
            except ValueError as exc:
                raise UpstreamProtocolError(f"upstream {self.name} answered invalid JSON") from exc
            return self.final(message, request_id, status)
        if status >= 400:
            raise UpstreamProtocolError(f"upstream {self.name} answered HTTP {status}", may_have_acted=False)
        if not content_type.startswith("text/event-stream"):
            raise UpstreamProtocolError(f"upstream {self.name} answered {content_type or 'no content type'}")
        final: dict[str, Any] | None = None
        messages = messages_resuming(
            response,
            self.reconnect(upstream_session),
            is_last=lambda m: "method" not in m and m.get("id") == request_id,
            on_pause=relay.on_pause,
            max_event_bytes=self.spec.max_response_bytes,
        )
        with self.event_bound(), single_exception():
            async with contextlib.aclosing(messages), contextlib.AsyncExitStack() as children:
                tg: anyio.abc.TaskGroup | None = None
                async for message in messages:
                    if "method" in message:
                        method = message["method"]
                        params = message.get("params") or {}
                        if "id" in message:
                            if tg is None:  # made only for a stream that asks the client something
                                tg = await children.enter_async_context(anyio.create_task_group())
                            tg.start_soon(
                                self.answer_server_request,
                                message["id"],
                                method,
                                params,
                                relay,
                                upstream_session,
                            )
                        elif isinstance(method, str) and isinstance(params, dict):
                            await self._on_stream_notification(method, params, relay, upstream_session)
                        continue
                    if message.get("id") == request_id:
                        final = message  # the last message: the stream is drained and ends
                if tg is not None:
                    tg.cancel_scope.cancel()
        if final is None:
            raise OutcomeUnknown(f"upstream {self.name} closed the stream without a result")
        return self.final(final, request_id, status)

    @contextlib.contextmanager
    def event_bound(self) -> Iterator[None]:
        """An SSE event over the bound ends the call naming this upstream (the stream is then closed)."""
        try:
            yield
        except UpstreamResponseTooLarge as exc:
            raise self.too_large("an SSE event") from exc

    def too_large(self, what: str) -> UpstreamResponseTooLarge:
        limit = self.spec.max_response_bytes
        return UpstreamResponseTooLarge(
            f"upstream {self.name} answered {what} over {limit} bytes", limit_bytes=limit
        )

    def reconnect(self, upstream_session: HttpUpstreamSession | None) -> Reconnect | None:
        """How a dropped response stream of this upstream session resumes (``upstream/resume.py``)."""
        if upstream_session is None or upstream_session.session_id is None:
            return None  # the sessionless era has no GET stream to resume on

        @contextlib.asynccontextmanager
        async def reconnect(last_event_id: str) -> AsyncIterator[UpstreamResponse]:
            headers = {
                **self.session_headers(upstream_session),
                "accept": "text/event-stream",
                "last-event-id": last_event_id,
            }
            async with self._client.stream("GET", self.url, headers=headers) as response:
                yield response

        return reconnect

    async def answer_server_request(
        self,
        upstream_request_id: Any,
        method: str,
        params: Any,
        relay: RequestRelay,
        upstream_session: HttpUpstreamSession | None,
    ) -> None:
        reply: dict[str, Any]
        if method == "ping":
            reply = {"jsonrpc": "2.0", "id": upstream_request_id, "result": {}}
        else:
            try:
                result = await relay.on_request(method, params if isinstance(params, dict) else {})
                reply = {"jsonrpc": "2.0", "id": upstream_request_id, "result": result}
            except ClientDeclined as exc:
                reply = {"jsonrpc": "2.0", "id": upstream_request_id, "error": exc.error}
        if upstream_session is None:
            return  # the sessionless era has no back channel for answers
        with contextlib.suppress(HttpFailure):
            await self._client.request(
                "POST",
                self.url,
                headers={**self.session_headers(upstream_session), "content-type": "application/json"},
                content=encode_body(reply),
            )

    def final(self, message: Any, request_id: int, status: int) -> dict[str, Any]:
        if not isinstance(message, dict) or message.get("id") != request_id:
            raise UpstreamProtocolError(
                f"upstream {self.name} answered a different request", may_have_acted=True
            )
        if "error" in message and isinstance(message["error"], dict):
            raise UpstreamReplied.checked(message["error"])
        result = message.get("result")
        if status >= 400 or not isinstance(result, dict):
            raise UpstreamProtocolError(f"upstream {self.name} answered HTTP {status} without a result")
        return result
