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
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

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
    ListChangedCallback,
    ResourceUpdatedCallback,
    UpstreamEra,
    UpstreamHealth,
    UpstreamReplied,
)
from bastion.upstream.capability_sets import bridged_capabilities, capability_set
from bastion.upstream.era_paths import (
    param_header_map,
    wants_session_path,
)
from bastion.upstream.failure import describe_failure
from bastion.upstream.http_client import (
    HttpFailure,
    UpstreamHttp,
)
from bastion.upstream.http_exchange import ACCEPT, GATEWAY_INFO, HttpExchange, encode_body
from bastion.upstream.http_listening import UpstreamListening
from bastion.upstream.http_session import HttpUpstreamSession, SessionGone
from bastion.upstream.input_rounds import ParkedRounds, ask_mid_call, asks_in_rounds, round_trip
from bastion.upstream.relay import RequestRelay
from bastion.upstream.resource_listens import ResourceListens
from bastion.versions import (
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_VERSION,
)

__all__ = ["HttpUpstream", "HttpUpstreamSession"]

logger = logging.getLogger(__name__)

# How long a new client's first request waits for its upstream session's GET stream to answer, so
# that what the upstream sends there from then on is seen (a server that holds its headers back
# until its first event costs this once per session, no more).
_STREAM_OPEN_WAIT_S = 2.0


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
        # The request exchange (upstream/http_exchange.py).
        # What it says outside an answer, and the streams it is followed on (upstream/http_listening.py).
        self._listening = UpstreamListening(self)
        self._wire = HttpExchange(
            spec, client, self._headers, on_stream_notification=self._listening.on_stream_notification
        )
        self.era = UpstreamEra.UNKNOWN
        self._catalog: HttpUpstreamSession | None = None
        self._connected = False
        self._detail: str | None = "not started"
        self._tools = 0
        self._on_list_changed = on_list_changed
        self._task_group: anyio.abc.TaskGroup | None = None
        # A sessionless upstream that also answers initialize: session-era clients get their own
        # upstream session there, so nothing of their era is lost (logging/setLevel, back channel).
        self.speaks_session = False
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
            lambda params, relay: self._wire.modern_request("subscriptions/listen", params, relay, {})
        )
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
        self._listening.close()
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
                    self._learn_capabilities(await self._wire.modern_request("server/discover", {}, None, {}))
                return
            try:
                result = await self._wire.modern_request("server/discover", {}, None, {})
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
            self._task_group.start_soon(self._listening.watch_catalog, self._catalog)

    def _become_sessionless_era(self) -> None:
        self.era = UpstreamEra.SESSIONLESS
        if self._on_list_changed is not None and self._task_group is not None:
            self._task_group.start_soon(self._listening.watch_subscriptions)

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
                    headers={**self._headers, "accept": ACCEPT, "content-type": "application/json"},
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
                return await self._wire.modern_request("tools/list", params, None, {})
            return await self._session_call_catalog("tools/list", params, ctx)

        tools = await self._all_tools(page)
        self._tools = len(tools)
        self._wire.param_maps = {}
        self._learn_param_maps(tools)
        return tools

    @property
    def followed_streams(self) -> int:
        """How many client sessions' GET streams are followed now (at most ``MAX_CLIENT_STREAMS``)."""
        return self._listening.followed_streams

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
            wire = self._wire
            tools = await self._all_tools(lambda p: wire.modern_request("tools/list", p, None, declared))
        else:
            listing = await self._open_session(declared)
            try:
                relay = RequestRelay(None, None)
                tools = await self._all_tools(lambda p: self._wire.post(listing, "tools/list", p, relay))
            except SessionGone as exc:
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
        self._wire.param_maps.update(
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
                        lambda p: self._wire.modern_request(method, p, relay, ctx.client_capabilities, ctx),
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
        headers = self._wire.session_headers(upstream_session)
        with contextlib.suppress(HttpFailure), anyio.move_on_after(5.0):
            await self._client.request("DELETE", self.url, headers=headers)

    async def notify_session(self, upstream_session: Any, method: str) -> None:
        if not isinstance(upstream_session, HttpUpstreamSession) or upstream_session.session_id is None:
            return
        headers = {**self._wire.session_headers(upstream_session), "content-type": "application/json"}
        with contextlib.suppress(HttpFailure):
            await self._client.request(
                "POST", self.url, headers=headers, content=encode_body({"jsonrpc": "2.0", "method": method})
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
                return await self._wire.post(self._catalog, method, params, RequestRelay(None, None))
            except SessionGone:
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
                        await self._listening.follow_own_session(upstream_session, wait_s=_STREAM_OPEN_WAIT_S)
                try:
                    await self._ensure_log_level(upstream_session, ctx.log_level)
                    return await self._wire.post(upstream_session, method, params, relay)
                except SessionGone:
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
            "clientInfo": GATEWAY_INFO,
        }
        provisional = HttpUpstreamSession(None, LATEST_HANDSHAKE_VERSION, capabilities)
        try:
            result, response_headers = await self._wire.post_raw(
                provisional, "initialize", init_params, RequestRelay(None, None), initialize=True
            )
        except SessionGone as exc:
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
                headers={**self._wire.session_headers(upstream_session), "content-type": "application/json"},
                content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            )
        except HttpFailure as exc:
            raise UpstreamUnavailable(f"upstream {self.name}: {type(exc).__name__}") from exc
        if response.status_code >= 400:
            raise UpstreamProtocolError(f"upstream {self.name} refused notifications/initialized")
        return upstream_session

    async def _ensure_log_level(self, upstream_session: HttpUpstreamSession, level: str | None) -> None:
        """The client's ``logging/setLevel`` reaches its own upstream session before its next request."""
        if level is None or upstream_session.log_level == level:
            return
        if "logging" not in upstream_session.server_capabilities:
            return  # the upstream does not log: nothing to set, nothing lost
        with contextlib.suppress(UpstreamReplied):
            relay = RequestRelay(None, None)
            await self._wire.post(upstream_session, "logging/setLevel", {"level": level}, relay)
        upstream_session.log_level = level

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
            await self._listening.follow_own_session(upstream_session)

    async def unsubscribe_resource(self, uri: str, ctx: CallContext) -> None:
        if self.shares_resource_feed(ctx):
            self._listens.release(uri)
            return
        await self.call("resources/unsubscribe", {"uri": uri}, ctx)
