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
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from mcp.shared.inbound import encode_header_value, mcp_param_headers

from bastion import __version__
from bastion.errors import (
    OutcomeUnknown,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamResponseTooLarge,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.policy.snapshot import ServerSpec
from bastion.tracing import inject_headers
from bastion.transport.jsonrpc import dumps
from bastion.upstream.base import (
    RESOURCE_UPDATED,
    SURFACE_LIST_CHANGED,
    CallContext,
    ClientDeclined,
    ListChangedCallback,
    ResourceUpdatedCallback,
    SessionChannel,
    UpstreamEra,
    UpstreamHealth,
    UpstreamReplied,
)
from bastion.upstream.capability_sets import bridged_capabilities, capability_set
from bastion.upstream.era_paths import (
    LIST_CHANGED_FILTER,
    param_header_map,
    wants_session_path,
    with_log_level,
)
from bastion.upstream.failure import describe_failure
from bastion.upstream.http_client import (
    BodyOverLimit,
    ConnectError,
    HttpFailure,
    HttpTimeout,
    UpstreamHttp,
    UpstreamResponse,
)
from bastion.upstream.input_rounds import ParkedRounds, ask_mid_call, asks_in_rounds, round_trip
from bastion.upstream.relay import RequestRelay
from bastion.upstream.resource_listens import ACK_TIMEOUT_S, ResourceListens
from bastion.upstream.resume import Reconnect, messages_resuming
from bastion.upstream.session_stream import ChannelRelay, StreamBudget, follow_session_stream
from bastion.upstream.taskgroups import single_exception
from bastion.versions import (
    CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_VERSION,
    PROTOCOL_VERSION_META_KEY,
)
from bastion.wire_value import loads_exact

__all__ = ["HttpUpstream", "HttpUpstreamSession"]

logger = logging.getLogger(__name__)

_ACCEPT = "application/json, text/event-stream"
_GATEWAY_INFO = {"name": "bastion", "version": __version__}
# How long a new client's first request waits for its upstream session's GET stream to answer, so
# that what the upstream sends there from then on is seen (a server that holds its headers back
# until its first event costs this once per session, no more).
_STREAM_OPEN_WAIT_S = 2.0


def _body(message: dict[str, Any]) -> bytes:
    return dumps(message)


class _SessionGone(Exception):
    """The upstream answered 404 to an upstream session id: re-initialize."""


@dataclass(eq=False)
class HttpUpstreamSession:
    """One upstream session (session era), opened for one client session."""

    session_id: str | None
    protocol_version: str
    capabilities: dict[str, Any]
    server_capabilities: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_level: str | None = None  # the level last sent with logging/setLevel
    # Its GET stream, followed from its opening (issue 22) or once its client subscribed (issue 9).
    watch: anyio.CancelScope | None = None
    # The owner's way back outside a request (None: the catalog session, or an ephemeral one).
    channel: SessionChannel | None = None
    # The relays of the requests in flight on it: a request its GET stream brings goes to one.
    relays: list[RequestRelay] = dataclasses.field(default_factory=list)
    # Its own tools/list (issue 22), with the upstream's catalog generation it was listed in.
    tools: list[dict[str, Any]] | None = None
    tools_generation: int = -1
    is_catalog: bool = False  # the gateway's own listing session, owned by no client


class HttpUpstream:
    """A Streamable HTTP MCP server behind the gateway."""

    def __init__(
        self,
        spec: ServerSpec,
        client: UpstreamHttp,
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
        self._listen_scope = anyio.CancelScope()
        # A sessionless upstream that also answers initialize: session-era clients get their own
        # upstream session there, so nothing of their era is lost (logging/setLevel, back channel).
        self.speaks_session = False
        self._param_maps: dict[str, dict[tuple[str, ...], str]] = {}
        self._parked = ParkedRounds()
        self.on_transport_error: Callable[[], None] | None = None
        # What the upstream offers (resources, prompts, completions: issue 9), learned at negotiation.
        self.server_capabilities: dict[str, Any] = {}
        # What server/discover declared, kept past a switch to the session era: a dual-era server
        # may declare its extensions there only (the SDK's do; issue 24, surface/capabilities.py).
        self.discovered_capabilities: dict[str, Any] = {}
        # Set by the fleet: prompts/resources list_changed from this upstream (issue 9).
        self.on_surface_changed: Callable[[str, str], Coroutine[Any, Any, None]] | None = None
        # Set by the gateway (surface/subscriptions.py): resources/updated from this upstream.
        self.on_resource_updated: ResourceUpdatedCallback | None = None
        self._listens = ResourceListens(
            lambda params, relay: self._modern_request("subscriptions/listen", params, relay, {})
        )
        # Each per-client upstream session's GET stream holds a pooled connection: bounded (issue 22).
        self._streams = StreamBudget()
        self._follows: set[anyio.CancelScope] = set()  # every followed client stream, ended by aclose
        # Rises when the catalog session says the tools changed: every own listing is then stale.
        self.tools_generation = 0

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
        for scope in list(self._follows):
            scope.cancel()
        self._listen_scope.cancel()
        self._listens.release_all()
        self._parked.cancel_all()
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
                self._become_sessionless_era()
                with contextlib.suppress(UpstreamReplied, UpstreamProtocolError):
                    self._learn_capabilities(await self._modern_request("server/discover", {}, None, {}))
                return
            try:
                result = await self._modern_request("server/discover", {}, None, {})
            except (UpstreamReplied, UpstreamProtocolError):
                result = None
            if result is not None and MODERN_VERSION in (result.get("supportedVersions") or []):
                self._learn_capabilities(result)
                try:
                    await self._become_session_era()
                    self.speaks_session = True
                except (UpstreamReplied, UpstreamProtocolError):
                    pass
                self._become_sessionless_era()
                return
            await self._become_session_era()

    def _learn_capabilities(self, result: dict[str, Any]) -> None:
        capabilities = result.get("capabilities")
        self.server_capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
        self.discovered_capabilities = dict(self.server_capabilities)

    async def _become_session_era(self) -> None:
        self._catalog = await self._open_session({})
        self._catalog.is_catalog = True
        self.server_capabilities = dict(self._catalog.server_capabilities)
        self.era = UpstreamEra.SESSION
        if self._on_list_changed is not None and self._task_group is not None:
            self._task_group.start_soon(self._watch_catalog, self._catalog)

    def _become_sessionless_era(self) -> None:
        self.era = UpstreamEra.SESSIONLESS
        if self._on_list_changed is not None and self._task_group is not None:
            self._task_group.start_soon(self._watch_subscriptions)

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
            with anyio.fail_after(timeout_s):
                response = await self._client.request(
                    "POST",
                    self.url,
                    headers={**self._headers, "accept": _ACCEPT, "content-type": "application/json"},
                    content=b'{"jsonrpc":"2.0","id":0,"method":"ping"}',
                )
        except (HttpFailure, TimeoutError) as exc:
            raise UpstreamUnavailable(f"upstream {self.name}: {describe_failure(exc)}") from exc
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
        ctx = CallContext(relay=None, client_capabilities={}, timeout_s=self._timeout())

        async def page(params: dict[str, Any]) -> dict[str, Any]:
            if self.era is UpstreamEra.SESSIONLESS:
                return await self._modern_request("tools/list", params, None, {})
            return await self._session_call_catalog("tools/list", params, ctx)

        tools = await self._all_tools(page)
        self._tools = len(tools)
        self._param_maps = {}
        self._learn_param_maps(tools)
        return tools

    @property
    def followed_streams(self) -> int:
        """How many client sessions' GET streams are followed now (at most ``MAX_CLIENT_STREAMS``)."""
        return self._streams.held

    def uses_own_session(self) -> bool:
        """Whether a session-era client's requests go on its own upstream session here."""
        if self.era is UpstreamEra.SESSIONLESS:
            return self.speaks_session
        return self.era is UpstreamEra.SESSION

    async def list_tools_for(self, client_capabilities: Any) -> list[dict[str, Any]]:
        """The tools this upstream shows a client of the capability set of ``client_capabilities``.

        Session era: listed on a short upstream session that declares those capabilities
        (closed at once); sessionless era: a ``tools/list`` carrying them in ``_meta``.
        Raises as :meth:`call` does.
        """
        if self.era is UpstreamEra.UNKNOWN:
            return await self.list_tools()
        declared = capability_set(client_capabilities)
        if self.era is UpstreamEra.SESSIONLESS:
            tools = await self._all_tools(lambda p: self._modern_request("tools/list", p, None, declared))
        else:
            listing = await self._open_session(declared)
            try:
                relay = RequestRelay(None, None)
                tools = await self._all_tools(lambda p: self._post(listing, "tools/list", p, relay))
            except _SessionGone as exc:
                raise UpstreamProtocolError(f"upstream {self.name} forgot a fresh session") from exc
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await self.close_session(listing)
        self._learn_param_maps(tools)
        return tools

    async def list_tools_own(self, ctx: CallContext) -> list[dict[str, Any]]:
        """The tools the client's own upstream session shows (opened if need be), as last listed there.

        A listing stays good until that session or the catalog session says the tools changed.
        Raises as :meth:`call` does.
        """
        holder = ctx.upstream_sessions
        own = holder.get(self.name) if holder is not None else None
        if isinstance(own, HttpUpstreamSession) and own.tools_generation == self.tools_generation:
            listed: list[dict[str, Any]] | None = own.tools
            if listed is not None:
                return listed
        generation = self.tools_generation
        tools = await self._all_tools(lambda p: self.call("tools/list", p, ctx))
        own = holder.get(self.name) if holder is not None else None
        if isinstance(own, HttpUpstreamSession):
            own.tools, own.tools_generation = tools, generation
        self._learn_param_maps(tools)
        return tools

    async def _all_tools(
        self, page: Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(100):
            result = await page({"cursor": cursor} if cursor else {})
            listed = result.get("tools")
            if not isinstance(listed, list):
                raise UpstreamProtocolError(f"{self.name}: tools/list result has no tools array")
            tools.extend(t for t in listed if isinstance(t, dict))
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        return tools

    def _learn_param_maps(self, tools: list[dict[str, Any]]) -> None:
        self._param_maps.update(
            {
                t["name"]: header_map
                for t in tools
                if isinstance(t.get("name"), str) and (header_map := param_header_map(t.get("inputSchema")))
            }
        )

    async def call(self, method: str, params: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        if self.era is UpstreamEra.UNKNOWN:
            try:
                await self._negotiate()
            except TimeoutError as exc:
                raise UpstreamUnavailable(f"upstream {self.name} did not answer negotiation") from exc
        relay = RequestRelay.for_call(ctx)
        try:
            with anyio.fail_after(ctx.timeout_s):
                if self.era is UpstreamEra.SESSIONLESS and not wants_session_path(self.speaks_session, ctx):
                    result = await ask_mid_call(
                        lambda p: self._modern_request(method, p, relay, ctx.client_capabilities, ctx),
                        params,
                        relay,
                        ctx,
                    )
                elif asks_in_rounds(method, ctx):
                    assert self._task_group is not None
                    result = await round_trip(
                        self._parked,
                        self._task_group,
                        params,
                        relay,
                        ctx,
                        lambda p, wire: self._session_call(method, p, wire, ctx),
                    )
                else:
                    result = await ask_mid_call(
                        lambda p: self._session_call(method, p, relay, ctx), params, relay, ctx
                    )
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
        if upstream_session.watch is not None:
            upstream_session.watch.cancel()
        upstream_session.channel = None  # nothing it still sends reaches its former owner
        headers = self._session_headers(upstream_session)
        with contextlib.suppress(HttpFailure), anyio.move_on_after(5.0):
            await self._client.request("DELETE", self.url, headers=headers)

    async def notify_session(self, upstream_session: Any, method: str) -> None:
        if not isinstance(upstream_session, HttpUpstreamSession) or upstream_session.session_id is None:
            return
        headers = {**self._session_headers(upstream_session), "content-type": "application/json"}
        with contextlib.suppress(HttpFailure):
            await self._client.request(
                "POST", self.url, headers=headers, content=_body({"jsonrpc": "2.0", "method": method})
            )

    # ------------------------------------------------------------------ session era

    async def _session_call_catalog(
        self, method: str, params: dict[str, Any], ctx: CallContext
    ) -> dict[str, Any]:
        for attempt in range(2):
            if self._catalog is None:
                self._catalog = await self._open_session({})
                self._catalog.is_catalog = True
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
                    declared = bridged_capabilities(ctx.client_capabilities)
                    upstream_session = await self._open_session(declared)
                    if holder is not None:
                        if holder.closed:
                            await self.close_session(upstream_session)
                            raise UpstreamUnavailable("the client session closed")
                        upstream_session.channel = holder.channel
                        holder.put(self.name, upstream_session)
                    if holder is not None or declared:
                        # What it sends outside a request reaches its owner (issue 22): a client's
                        # own session from its opening; an ephemeral one when it may ask something.
                        await self._follow_own_session(upstream_session, wait_s=_STREAM_OPEN_WAIT_S)
                try:
                    await self._ensure_log_level(upstream_session, ctx.log_level)
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
        server_capabilities = result.get("capabilities")
        upstream_session = HttpUpstreamSession(
            response_headers.get("mcp-session-id"),
            version,
            capabilities,
            server_capabilities if isinstance(server_capabilities, dict) else {},
        )
        try:
            response = await self._client.request(
                "POST",
                self.url,
                headers={**self._session_headers(upstream_session), "content-type": "application/json"},
                content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            )
        except HttpFailure as exc:
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
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        request_id = next(self._ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": relay.outbound_params(params)}
        headers = self._session_headers(upstream_session)
        if initialize:
            headers.pop("mcp-protocol-version", None)
        headers["content-type"] = "application/json"
        answered = False
        upstream_session.relays.append(relay)
        try:
            async with self._stream(headers, body) as response:
                if response.status_code == 404 and upstream_session.session_id is not None:
                    raise _SessionGone()
                result = await self._read_reply(response, request_id, relay, upstream_session)
                answered = True
                return result, response.headers
        finally:
            upstream_session.relays.remove(relay)
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
        with contextlib.suppress(HttpFailure):
            await self._client.request(
                "POST",
                self.url,
                headers={**self._session_headers(upstream_session), "content-type": "application/json"},
                content=_body(message),
            )

    # ------------------------------------------------------------------ sessionless era

    async def _modern_request(
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
        meta[CAPABILITIES_META_KEY] = bridged_capabilities(client_capabilities)
        meta[CLIENT_INFO_META_KEY] = _GATEWAY_INFO
        outbound["_meta"] = with_log_level(meta, ctx)
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
        arguments = params.get("arguments")
        if method == "tools/call" and isinstance(name, str) and isinstance(arguments, dict):
            # x-mcp-header parameters are mirrored as Mcp-Param-* headers, as the upstream requires.
            headers.update(mcp_param_headers(self._param_maps.get(name, {}), arguments))
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": outbound}
        # Closing this request's stream is the sessionless era's cancellation.
        async with self._stream(headers, body) as response:
            return await self._read_reply(response, request_id, relay, None)

    # ------------------------------------------------------------------ wire

    @contextlib.asynccontextmanager
    async def _stream(self, headers: dict[str, str], body: dict[str, Any]) -> AsyncIterator[UpstreamResponse]:
        inject_headers(headers)  # the gateway's span context, when a call is traced (tracing.py)
        sent = False
        try:
            async with self._client.stream(
                "POST", self.url, headers=headers, content=_body(body)
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

    async def _read_reply(
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
                raise self._too_large("a JSON body") from exc
            try:
                message = loads_exact(raw)
            except ValueError as exc:
                raise UpstreamProtocolError(f"upstream {self.name} answered invalid JSON") from exc
            return self._final(message, request_id, status)
        if status >= 400:
            raise UpstreamProtocolError(f"upstream {self.name} answered HTTP {status}", may_have_acted=False)
        if not content_type.startswith("text/event-stream"):
            raise UpstreamProtocolError(f"upstream {self.name} answered {content_type or 'no content type'}")
        final: dict[str, Any] | None = None
        messages = messages_resuming(
            response,
            self._reconnect(upstream_session),
            is_last=lambda m: "method" not in m and m.get("id") == request_id,
            on_pause=relay.on_pause,
            max_event_bytes=self.spec.max_response_bytes,
        )
        with self._event_bound(), single_exception():
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
                                self._answer_server_request,
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
        return self._final(final, request_id, status)

    @contextlib.contextmanager
    def _event_bound(self) -> Iterator[None]:
        """An SSE event over the bound ends the call naming this upstream (the stream is then closed)."""
        try:
            yield
        except UpstreamResponseTooLarge as exc:
            raise self._too_large("an SSE event") from exc

    def _too_large(self, what: str) -> UpstreamResponseTooLarge:
        limit = self.spec.max_response_bytes
        return UpstreamResponseTooLarge(
            f"upstream {self.name} answered {what} over {limit} bytes", limit_bytes=limit
        )

    def _reconnect(self, upstream_session: HttpUpstreamSession | None) -> Reconnect | None:
        """How a dropped response stream of this upstream session resumes (``upstream/resume.py``)."""
        if upstream_session is None or upstream_session.session_id is None:
            return None  # the sessionless era has no GET stream to resume on

        @contextlib.asynccontextmanager
        async def reconnect(last_event_id: str) -> AsyncIterator[UpstreamResponse]:
            headers = {
                **self._session_headers(upstream_session),
                "accept": "text/event-stream",
                "last-event-id": last_event_id,
            }
            async with self._client.stream("GET", self.url, headers=headers) as response:
                yield response

        return reconnect

    async def _on_stream_notification(
        self,
        method: str,
        params: dict[str, Any],
        relay: RequestRelay,
        upstream_session: HttpUpstreamSession | None = None,
    ) -> None:
        if method == RESOURCE_UPDATED:
            # Never the calling request's: it goes to the subscribers of that URI (issue 9).
            self._resource_updated(params, upstream_session)
            return
        if method in SURFACE_LIST_CHANGED:
            if self.on_surface_changed is not None and self._task_group is not None:
                self._task_group.start_soon(self.on_surface_changed, self.name, method)
            return
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
        with contextlib.suppress(HttpFailure):
            await self._client.request(
                "POST",
                self.url,
                headers={**self._session_headers(upstream_session), "content-type": "application/json"},
                content=_body(reply),
            )

    def _final(self, message: Any, request_id: int, status: int) -> dict[str, Any]:
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

    async def _ensure_log_level(self, upstream_session: HttpUpstreamSession, level: str | None) -> None:
        """The client's ``logging/setLevel`` reaches its own upstream session before its next request."""
        if level is None or upstream_session.log_level == level:
            return
        if "logging" not in upstream_session.server_capabilities:
            return  # the upstream does not log: nothing to set, nothing lost
        with contextlib.suppress(UpstreamReplied):
            await self._post(upstream_session, "logging/setLevel", {"level": level}, RequestRelay(None, None))
        upstream_session.log_level = level

    async def _watch_subscriptions(self) -> None:
        """A sessionless upstream's ``tools/list_changed`` arrives on a ``subscriptions/listen`` stream."""
        with self._listen_scope:
            backoff = 0.5
            while True:
                with contextlib.suppress(UpstreamError, UpstreamReplied):
                    await self._modern_request(
                        "subscriptions/listen", {"notifications": LIST_CHANGED_FILTER}, None, {}
                    )
                    backoff = 0.5
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _watch_catalog(self, catalog: HttpUpstreamSession) -> None:
        """Listen on the catalog session's GET stream for ``tools/list_changed``."""
        with self._watch_scope:
            await self._watch_catalog_forever(catalog)

    async def _watch_catalog_forever(self, catalog: HttpUpstreamSession) -> None:
        async def on_message(message: dict[str, Any]) -> None:
            await self._on_session_message(message, catalog)

        await follow_session_stream(
            self._client,
            self.url,
            self._session_headers(catalog),
            on_message,
            max_event_bytes=self.spec.max_response_bytes,
        )

    async def _on_session_message(
        self, message: dict[str, Any], upstream_session: HttpUpstreamSession
    ) -> None:
        """One message of an upstream session's GET stream: the catalog session's, or a client's own.

        A client's own session speaks to that client alone (issue 22): a request goes to one of its
        calls in flight there (its stream) or else to its GET stream, a log message likewise, and a
        list change refreshes its view and tells it; the catalog session's list changes reach every
        client that sees the namespace.
        """
        method = message.get("method")
        raw = message.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if not isinstance(method, str):
            return
        own = not upstream_session.is_catalog
        if "id" in message:
            if own and self._task_group is not None:
                self._task_group.start_soon(
                    self._answer_server_request,
                    message["id"],
                    method,
                    params,
                    self._owner_relay(upstream_session),
                    upstream_session,
                )
            return
        if method == RESOURCE_UPDATED:
            self._resource_updated(params, upstream_session)
        elif not own:
            if method == "notifications/tools/list_changed" and self._on_list_changed:
                self.tools_generation += 1
                await self._on_list_changed(self.name)
            elif method in SURFACE_LIST_CHANGED and self.on_surface_changed:
                await self.on_surface_changed(self.name, method)
        elif method == "notifications/tools/list_changed":
            upstream_session.tools = None
            if upstream_session.channel is not None:
                await upstream_session.channel.tools_changed(self.name)
        elif method in SURFACE_LIST_CHANGED:
            if upstream_session.channel is not None:
                await upstream_session.channel.notify(method, {})
        elif method == "notifications/progress":
            # Only the request that minted the token hears it (upstream/relay.py checks it again).
            token = params.get("progressToken")
            for relay in upstream_session.relays:
                if relay.upstream_token is not None and relay.upstream_token == token:
                    await relay.on_notification(method, params)
        elif method == "notifications/message":
            live = self._live_relay(upstream_session)
            if live is not None:
                await live.on_notification(method, params)  # at the level that call hears
            elif upstream_session.channel is not None:
                await upstream_session.channel.notify(method, params)

    @staticmethod
    def _live_relay(upstream_session: HttpUpstreamSession) -> RequestRelay | None:
        """The latest request in flight on this session that has a client behind it."""
        for relay in reversed(upstream_session.relays):
            if relay.relay is not None:
                return relay
        return None

    def _owner_relay(self, upstream_session: HttpUpstreamSession) -> RequestRelay:
        """Where a request from this session's GET stream is asked: a call of its owner in flight
        there, else the owner's GET stream, else nobody (the upstream is answered an error)."""
        live = self._live_relay(upstream_session)
        if live is not None:
            return live
        channel = upstream_session.channel
        return RequestRelay(ChannelRelay(channel) if channel is not None else None, None)

    # ------------------------------------------------------------------ resource subscriptions (issue 9)

    def shares_resource_feed(self, ctx: CallContext) -> bool:
        """True when a subscription made for ``ctx`` serves every client (a sessionless upstream's listen
        stream); False when it lives on the client's own upstream session."""
        return self.era is UpstreamEra.SESSIONLESS and not wants_session_path(self.speaks_session, ctx)

    async def subscribe_resource(self, uri: str, ctx: CallContext) -> None:
        """Subscribe upstream: a held listen stream (shared), or ``resources/subscribe`` on the client's
        own upstream session, whose GET stream is then followed (its updates arrive there)."""
        if self.shares_resource_feed(ctx):
            assert self._task_group is not None
            await self._listens.hold(uri, self._task_group)
            return
        await self.call("resources/subscribe", {"uri": uri}, ctx)
        holder = ctx.upstream_sessions
        upstream_session = holder.get(self.name) if holder is not None else None
        if isinstance(upstream_session, HttpUpstreamSession) and upstream_session.watch is None:
            await self._follow_own_session(upstream_session)

    async def unsubscribe_resource(self, uri: str, ctx: CallContext) -> None:
        if self.shares_resource_feed(ctx):
            self._listens.release(uri)
            return
        await self.call("resources/unsubscribe", {"uri": uri}, ctx)

    async def _follow_own_session(
        self, upstream_session: HttpUpstreamSession, *, wait_s: float = ACK_TIMEOUT_S
    ) -> None:
        """Follow this session's GET stream until the session closes; return once it is open.

        At most ``StreamBudget`` streams per upstream: past it the session is used unfollowed
        (what it sends outside a request is then lost, and logged once per session).
        """
        if self._task_group is None or upstream_session.session_id is None:
            return  # a stateless upstream session has no GET stream
        if upstream_session.watch is not None:
            return
        if not self._streams.take():
            logger.warning("upstream %s: GET stream bound reached, a session goes unfollowed", self.name)
            return
        scope = upstream_session.watch = anyio.CancelScope()
        opened = anyio.Event()

        async def on_message(message: dict[str, Any]) -> None:
            await self._on_session_message(message, upstream_session)

        async def follow() -> None:
            try:
                with scope:
                    await follow_session_stream(
                        self._client,
                        self.url,
                        self._session_headers(upstream_session),
                        on_message,
                        opened=opened,
                        max_event_bytes=self.spec.max_response_bytes,
                    )
            finally:
                self._follows.discard(scope)
                self._streams.give_back()

        self._follows.add(scope)
        self._task_group.start_soon(follow)
        with anyio.move_on_after(wait_s):
            await opened.wait()

    def _resource_updated(self, params: dict[str, Any], upstream_session: HttpUpstreamSession | None) -> None:
        uri = params.get("uri")
        if isinstance(uri, str) and self.on_resource_updated is not None:
            self.on_resource_updated(self.name, uri, upstream_session)
