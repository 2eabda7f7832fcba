"""A Streamable HTTP upstream, in either era (DESIGN sections 0, 2 step 7, 5).

Era is found by negotiation at start: a ``server/discover`` probe at the
sessionless revision; anything but a result that lists it means the session
era. Session era: one upstream session per client transport session, opened
lazily, reused while the upstream accepts it, re-initialized once on an
upstream 404 (the request was not processed, so resending is safe), and
closed with DELETE when the client session ends. A sessionless client
(no transport session) gets an ephemeral upstream session for its one
request. Sessionless era: every request is independent over the shared
connection pool.

Client credentials never reach here: only the headers configured for this
upstream are sent.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import httpx2 as httpx
from mcp.shared.inbound import encode_header_value

from bastion import __version__
from bastion.errors import (
    OutcomeUnknown,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.policy.snapshot import ServerSpec
from bastion.upstream.base import (
    CallContext,
    ClientDeclined,
    ListChangedCallback,
    UpstreamEra,
    UpstreamHealth,
    UpstreamReplied,
)
from bastion.upstream.relay import RequestRelay
from bastion.upstream.sse import iter_sse_messages
from bastion.upstream.taskgroups import single_exception
from bastion.versions import (
    CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_VERSION,
    PROTOCOL_VERSION_META_KEY,
)

__all__ = ["HttpUpstream", "HttpUpstreamSession"]

logger = logging.getLogger(__name__)

_ACCEPT = "application/json, text/event-stream"
_GATEWAY_INFO = {"name": "bastion", "version": __version__}
_MAX_INPUT_ROUNDS = 10
_SEND_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class _SessionGone(Exception):
    """The upstream answered 404 to an upstream session id: re-initialize."""


@dataclass
class HttpUpstreamSession:
    """One upstream session (session era), opened for one client session."""

    session_id: str | None
    protocol_version: str
    capabilities: dict[str, Any]


def _relayable_capabilities(client_capabilities: Any) -> dict[str, Any]:
    # Only what the client itself declared, and only the client-side features
    # an upstream may use through the gateway.
    if not isinstance(client_capabilities, dict):
        return {}
    return {k: v for k, v in client_capabilities.items() if k in ("sampling", "elicitation", "roots")}


class HttpUpstream:
    """A Streamable HTTP MCP server behind the gateway."""

    def __init__(
        self,
        spec: ServerSpec,
        client: httpx.AsyncClient,
        *,
        on_list_changed: ListChangedCallback | None = None,
    ) -> None:
        assert spec.url is not None
        self.spec = spec
        self.name = spec.name
        self.namespace = spec.namespace
        self.url = spec.url
        self._client = client
        self._headers = dict(spec.headers)
        self._ids = itertools.count(1)
        self.era = UpstreamEra.UNKNOWN
        self._catalog: HttpUpstreamSession | None = None
        self._connected = False
        self._detail: str | None = "not started"
        self._tools = 0
        self._on_list_changed = on_list_changed
        self._task_group: anyio.abc.TaskGroup | None = None
        self._watch_scope = anyio.CancelScope()
        self.on_transport_error: Callable[[], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group
        try:
            await self._negotiate()
            self._connected = True
            self._detail = None
        except UpstreamError as exc:
            self._connected = False
            self._detail = exc.message
            logger.warning("upstream %s not reachable at start: %s", self.name, exc.message)

    async def aclose(self) -> None:
        self._watch_scope.cancel()
        if self._catalog is not None:
            with anyio.move_on_after(2, shield=True):
                await self.close_session(self._catalog)
            self._catalog = None

    async def _negotiate(self) -> None:
        with anyio.fail_after(self._timeout()):
            if self.spec.era == "session":
                await self._become_session_era()
                return
            if self.spec.era == "sessionless":
                self.era = UpstreamEra.SESSIONLESS
                return
            try:
                result = await self._modern_request("server/discover", {}, None, {})
            except (UpstreamReplied, UpstreamProtocolError):
                result = None
            if result is not None and MODERN_VERSION in (result.get("supportedVersions") or []):
                self.era = UpstreamEra.SESSIONLESS
                return
            await self._become_session_era()

    async def _become_session_era(self) -> None:
        self._catalog = await self._open_session({})
        self.era = UpstreamEra.SESSION
        if self._on_list_changed is not None and self._task_group is not None:
            self._task_group.start_soon(self._watch_catalog, self._catalog)

    def _mark_disconnected(self, detail: str) -> None:
        self.mark_down(detail)

    # Active health (upstream/health.py) drives these: probe on an interval and on transport errors.

    def mark_down(self, detail: str) -> None:
        """The transport is known down: health says so (and mutating calls are gated) from now on."""
        self._connected, self._detail = False, detail
        self.nudge_health()

    def mark_up(self) -> None:
        self._connected, self._detail = True, None

    def needs_negotiation(self) -> bool:
        """Down at start: the era was never learned (the next listing negotiates it)."""
        return self.era is UpstreamEra.UNKNOWN

    def nudge_health(self) -> None:
        """A transport error was seen: ask the health prober to look now, not at its next interval."""
        if self.on_transport_error is not None:
            self.on_transport_error()

    async def knock(self, timeout_s: float) -> None:
        """One health probe: a ``ping`` POST; any HTTP answer below 500 means the transport is up.

        Raises:
            UpstreamUnavailable: no connection, no answer within ``timeout_s``, or a 5xx answer.
        """
        try:
            response = await self._client.post(
                self.url,
                headers={**self._headers, "accept": _ACCEPT, "content-type": "application/json"},
                content=b'{"jsonrpc":"2.0","id":0,"method":"ping"}',
                timeout=timeout_s,
            )
            await response.aclose()
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"upstream {self.name}: {type(exc).__name__}") from exc
        if response.status_code >= 500:
            raise UpstreamUnavailable(f"upstream {self.name} answered HTTP {response.status_code}")

    def health(self) -> UpstreamHealth:
        return UpstreamHealth(
            name=self.name,
            namespace=self.namespace,
            kind="http",
            era=self.era.value,
            connected=self._connected,
            tools=self._tools,
            detail=self._detail,
        )

    def _timeout(self) -> float:
        return self.spec.timeout_s or 30.0

    # ------------------------------------------------------------------ public calls

    async def list_tools(self) -> list[dict[str, Any]]:
        if self.era is UpstreamEra.UNKNOWN:
            await self._negotiate()
            self._connected = True
            self._detail = None
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        ctx = CallContext(relay=None, client_capabilities={}, timeout_s=self._timeout())
        for _ in range(100):
            params: dict[str, Any] = {"cursor": cursor} if cursor else {}
            if self.era is UpstreamEra.SESSIONLESS:
                result = await self._modern_request("tools/list", params, None, {})
            else:
                result = await self._session_call_catalog("tools/list", params, ctx)
            page = result.get("tools")
            if not isinstance(page, list):
                raise UpstreamProtocolError(f"{self.name}: tools/list result has no tools array")
            tools.extend(t for t in page if isinstance(t, dict))
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        self._tools = len(tools)
        return tools

    async def call(self, method: str, params: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        if self.era is UpstreamEra.UNKNOWN:
            try:
                await self._negotiate()
            except TimeoutError as exc:
                raise UpstreamUnavailable(f"upstream {self.name} did not answer negotiation") from exc
        relay = RequestRelay(ctx.relay, ctx.progress_token)
        try:
            with anyio.fail_after(ctx.timeout_s):
                if self.era is UpstreamEra.SESSIONLESS:
                    result = await self._modern_call(method, params, relay, ctx)
                else:
                    result = await self._session_call(method, params, relay, ctx)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"upstream {self.name} did not answer within {ctx.timeout_s:g}s") from exc
        except UpstreamUnavailable as exc:
            # The transport is down (nothing could be sent): health says so until it answers again.
            self._mark_disconnected(exc.message)
            raise
        except OutcomeUnknown:
            self.nudge_health()  # a lost connection may be a dead upstream: probe now
            raise
        if not self._connected:
            self._connected, self._detail = True, None
        return result

    async def close_session(self, upstream_session: Any) -> None:
        if not isinstance(upstream_session, HttpUpstreamSession) or upstream_session.session_id is None:
            return
        headers = self._session_headers(upstream_session)
        with contextlib.suppress(httpx.HTTPError):
            await self._client.delete(self.url, headers=headers, timeout=5.0)

    # ------------------------------------------------------------------ session era

    async def _session_call_catalog(
        self, method: str, params: dict[str, Any], ctx: CallContext
    ) -> dict[str, Any]:
        for attempt in range(2):
            if self._catalog is None:
                self._catalog = await self._open_session({})
            try:
                return await self._post(self._catalog, method, params, RequestRelay(None, None))
            except _SessionGone:
                self._catalog = None
                if attempt:
                    break
        raise UpstreamProtocolError(f"upstream {self.name} keeps refusing its session")

    async def _session_call(
        self, method: str, params: dict[str, Any], relay: RequestRelay, ctx: CallContext
    ) -> dict[str, Any]:
        holder = ctx.upstream_sessions
        ephemeral = holder is None
        upstream_session: HttpUpstreamSession | None = None
        try:
            for attempt in range(2):
                upstream_session = holder.get(self.name) if holder is not None else None
                if upstream_session is None:
                    upstream_session = await self._open_session(
                        _relayable_capabilities(ctx.client_capabilities) if not ephemeral else {}
                    )
                    if holder is not None:
                        if holder.closed:
                            await self.close_session(upstream_session)
                            raise UpstreamUnavailable("the client session closed")
                        holder.put(self.name, upstream_session)
                try:
                    return await self._post(upstream_session, method, params, relay)
                except _SessionGone:
                    # The upstream forgot this session; it did not process the request.
                    if holder is not None:
                        holder.drop(self.name, upstream_session)
                    upstream_session = None
                    if attempt:
                        break
            raise UpstreamProtocolError(f"upstream {self.name} refused a fresh session", may_have_acted=False)
        finally:
            if ephemeral and upstream_session is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await self.close_session(upstream_session)

    async def _open_session(self, capabilities: dict[str, Any]) -> HttpUpstreamSession:
        init_params = {
            "protocolVersion": LATEST_HANDSHAKE_VERSION,
            "capabilities": capabilities,
            "clientInfo": _GATEWAY_INFO,
        }
        provisional = HttpUpstreamSession(None, LATEST_HANDSHAKE_VERSION, capabilities)
        try:
            result, response_headers = await self._post_raw(
                provisional, "initialize", init_params, RequestRelay(None, None), initialize=True
            )
        except _SessionGone as exc:
            raise UpstreamProtocolError(f"upstream {self.name} answered 404 to initialize") from exc
        version = result.get("protocolVersion")
        if version not in HANDSHAKE_VERSIONS:
            raise UpstreamProtocolError(f"upstream {self.name} negotiated unsupported version {version!r}")
        upstream_session = HttpUpstreamSession(response_headers.get("mcp-session-id"), version, capabilities)
        try:
            response = await self._client.post(
                self.url,
                headers={**self._session_headers(upstream_session), "content-type": "application/json"},
                content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            )
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"upstream {self.name}: {type(exc).__name__}") from exc
        if response.status_code >= 400:
            raise UpstreamProtocolError(f"upstream {self.name} refused notifications/initialized")
        return upstream_session

    def _session_headers(self, upstream_session: HttpUpstreamSession) -> dict[str, str]:
        headers = {
            **self._headers,
            "accept": _ACCEPT,
            "mcp-protocol-version": upstream_session.protocol_version,
        }
        if upstream_session.session_id is not None:
            headers["mcp-session-id"] = upstream_session.session_id
        return headers

    async def _post(
        self, upstream_session: HttpUpstreamSession, method: str, params: dict[str, Any], relay: RequestRelay
    ) -> dict[str, Any]:
        result, _ = await self._post_raw(upstream_session, method, params, relay)
        return result

    async def _post_raw(
        self,
        upstream_session: HttpUpstreamSession,
        method: str,
        params: dict[str, Any],
        relay: RequestRelay,
        *,
        initialize: bool = False,
    ) -> tuple[dict[str, Any], httpx.Headers]:
        request_id = next(self._ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": relay.outbound_params(params)}
        headers = self._session_headers(upstream_session)
        if initialize:
            headers.pop("mcp-protocol-version", None)
        headers["content-type"] = "application/json"
        answered = False
        try:
            async with self._stream(headers, body) as response:
                if response.status_code == 404 and upstream_session.session_id is not None:
                    raise _SessionGone()
                result = await self._read_reply(response, request_id, relay, upstream_session)
                answered = True
                return result, response.headers
        finally:
            if not answered and not initialize and method != "initialize":
                # Abandoned (cancelled, timed out or failed): tell the upstream to stop.
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await self._notify_cancelled(upstream_session, request_id)

    async def _notify_cancelled(self, upstream_session: HttpUpstreamSession, request_id: int) -> None:
        message = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "cancelled by the client"},
        }
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(
                self.url,
                headers={**self._session_headers(upstream_session), "content-type": "application/json"},
                json=message,
            )

    # ------------------------------------------------------------------ sessionless era

    async def _modern_call(
        self, method: str, params: dict[str, Any], relay: RequestRelay, ctx: CallContext
    ) -> dict[str, Any]:
        """One sessionless request; for a session-era client, "input required" rounds are served here."""
        for _ in range(_MAX_INPUT_ROUNDS):
            result = await self._modern_request(method, params, relay, ctx.client_capabilities)
            if result.get("resultType") != "input_required" or not ctx.client_answers_requests:
                return result
            requests = result.get("inputRequests") or {}
            if not isinstance(requests, dict):
                raise UpstreamProtocolError(f"upstream {self.name} sent malformed inputRequests")
            responses: dict[str, Any] = {}
            for key, request in requests.items():
                if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                    raise UpstreamProtocolError(f"upstream {self.name} sent a malformed input request")
                try:
                    responses[key] = await relay.on_request(request["method"], request.get("params") or {})
                except ClientDeclined as exc:
                    raise UpstreamReplied(exc.error) from exc
            params = {**params, "inputResponses": responses}
            if "requestState" in result:
                params["requestState"] = result["requestState"]
        raise UpstreamProtocolError(f"upstream {self.name} kept asking for input")

    async def _modern_request(
        self,
        method: str,
        params: dict[str, Any],
        relay: RequestRelay | None,
        client_capabilities: Any,
    ) -> dict[str, Any]:
        relay = relay or RequestRelay(None, None)
        request_id = next(self._ids)
        outbound = dict(relay.outbound_params(params))
        meta = dict(outbound.get("_meta") or {})
        meta[PROTOCOL_VERSION_META_KEY] = MODERN_VERSION
        meta[CAPABILITIES_META_KEY] = _relayable_capabilities(client_capabilities)
        meta[CLIENT_INFO_META_KEY] = _GATEWAY_INFO
        outbound["_meta"] = meta
        headers = {
            **self._headers,
            "accept": _ACCEPT,
            "content-type": "application/json",
            "mcp-protocol-version": MODERN_VERSION,
            "mcp-method": method,
        }
        name = params.get("name") if method in ("tools/call", "prompts/get") else params.get("uri")
        if isinstance(name, str) and method in ("tools/call", "prompts/get", "resources/read"):
            headers["mcp-name"] = encode_header_value(name)
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": outbound}
        # Closing this request's stream is the sessionless era's cancellation.
        async with self._stream(headers, body) as response:
            return await self._read_reply(response, request_id, relay, None)

    # ------------------------------------------------------------------ wire

    @contextlib.asynccontextmanager
    async def _stream(self, headers: dict[str, str], body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        request = self._client.build_request("POST", self.url, headers=headers, json=body)
        try:
            response = await self._client.send(request, stream=True)
        except _SEND_FAILURES as exc:
            raise UpstreamUnavailable(f"upstream {self.name}: {type(exc).__name__}") from exc
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"upstream {self.name}: {type(exc).__name__}") from exc
        except httpx.HTTPError as exc:
            raise OutcomeUnknown(f"upstream {self.name}: {type(exc).__name__}") from exc
        try:
            yield response
        except httpx.HTTPError as exc:
            raise OutcomeUnknown(f"upstream {self.name}: connection lost ({type(exc).__name__})") from exc
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def _read_reply(
        self,
        response: httpx.Response,
        request_id: int,
        relay: RequestRelay,
        upstream_session: HttpUpstreamSession | None,
    ) -> dict[str, Any]:
        status = response.status_code
        content_type = response.headers.get("content-type", "")
        if status >= 500:
            raise OutcomeUnknown(f"upstream {self.name} answered HTTP {status}")
        if content_type.startswith("application/json"):
            raw = await response.aread()
            try:
                message = httpx.Response(200, content=raw).json()
            except ValueError as exc:
                raise UpstreamProtocolError(f"upstream {self.name} answered invalid JSON") from exc
            return self._final(message, request_id, status)
        if status >= 400:
            raise UpstreamProtocolError(f"upstream {self.name} answered HTTP {status}", may_have_acted=False)
        if not content_type.startswith("text/event-stream"):
            raise UpstreamProtocolError(f"upstream {self.name} answered {content_type or 'no content type'}")
        final: dict[str, Any] | None = None
        with single_exception():
            async with anyio.create_task_group() as tg:
                async for message in iter_sse_messages(response.aiter_lines()):
                    if "method" in message:
                        method = message["method"]
                        params = message.get("params") or {}
                        if "id" in message:
                            tg.start_soon(
                                self._answer_server_request,
                                message["id"],
                                method,
                                params,
                                relay,
                                upstream_session,
                            )
                        elif isinstance(method, str) and isinstance(params, dict):
                            await self._on_stream_notification(method, params, relay)
                        continue
                    if message.get("id") == request_id:
                        final = message
                        break
                tg.cancel_scope.cancel()
        if final is None:
            raise OutcomeUnknown(f"upstream {self.name} closed the stream without a result")
        return self._final(final, request_id, status)

    async def _on_stream_notification(self, method: str, params: dict[str, Any], relay: RequestRelay) -> None:
        if method == "notifications/tools/list_changed":
            if self._on_list_changed is not None and self._task_group is not None:
                self._task_group.start_soon(self._on_list_changed, self.name)
            return
        await relay.on_notification(method, params)

    async def _answer_server_request(
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
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(
                self.url,
                headers={**self._session_headers(upstream_session), "content-type": "application/json"},
                json=reply,
            )

    def _final(self, message: Any, request_id: int, status: int) -> dict[str, Any]:
        if not isinstance(message, dict) or message.get("id") != request_id:
            raise UpstreamProtocolError(
                f"upstream {self.name} answered a different request", may_have_acted=True
            )
        if "error" in message and isinstance(message["error"], dict):
            raise UpstreamReplied(message["error"])
        result = message.get("result")
        if status >= 400 or not isinstance(result, dict):
            raise UpstreamProtocolError(f"upstream {self.name} answered HTTP {status} without a result")
        return result

    async def _watch_catalog(self, catalog: HttpUpstreamSession) -> None:
        """Listen on the catalog session's GET stream for ``tools/list_changed``."""
        with self._watch_scope:
            await self._watch_catalog_forever(catalog)

    async def _watch_catalog_forever(self, catalog: HttpUpstreamSession) -> None:
        backoff = 0.5
        while True:
            try:
                async with self._client.stream(
                    "GET",
                    self.url,
                    headers={**self._session_headers(catalog), "accept": "text/event-stream"},
                    timeout=httpx.Timeout(None, connect=5.0),
                ) as response:
                    if response.status_code != 200:
                        return
                    backoff = 0.5
                    async for message in iter_sse_messages(response.aiter_lines()):
                        if (
                            message.get("method") == "notifications/tools/list_changed"
                            and self._on_list_changed
                        ):
                            await self._on_list_changed(self.name)
            except (httpx.HTTPError, UpstreamProtocolError):
                pass
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
