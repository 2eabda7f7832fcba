"""What a Streamable HTTP upstream says outside an answer, and to whom it goes (issues 9, 22).

Owns following the GET stream of each upstream session (the gateway's catalog session, and each
client's own, bounded by :class:`StreamBudget`), the sessionless era's ``subscriptions/listen``
stream, and routing each message: a request or log message of a client's own upstream session
reaches that client alone (a call of its in flight there, else its GET stream), list changes on
the catalog session reach every client that sees the namespace, ``resources/updated`` goes to the
subscribers of that URI. Never another client's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio
import anyio.abc

from bastion.errors import UpstreamError
from bastion.policy.snapshot import ServerSpec
from bastion.upstream.base import (
    RESOURCE_UPDATED,
    SURFACE_LIST_CHANGED,
    TASK_STATUS,
    ListChangedCallback,
    ResourceUpdatedCallback,
    UpstreamReplied,
)
from bastion.upstream.era_paths import LIST_CHANGED_FILTER
from bastion.upstream.http_client import UpstreamHttp
from bastion.upstream.http_exchange import HttpExchange
from bastion.upstream.http_session import HttpUpstreamSession
from bastion.upstream.relay import RequestRelay
from bastion.upstream.resource_listens import ACK_TIMEOUT_S
from bastion.upstream.session_stream import ChannelRelay, StreamBudget, follow_session_stream

__all__ = ["ListeningUpstream", "UpstreamListening"]

logger = logging.getLogger("bastion.upstream.streamable_http")


class ListeningUpstream(Protocol):
    """What the listening reads of its :class:`~bastion.upstream.streamable_http.HttpUpstream`."""

    name: str
    url: str
    spec: ServerSpec
    _client: UpstreamHttp
    _wire: HttpExchange
    _task_group: anyio.abc.TaskGroup | None
    _on_list_changed: ListChangedCallback | None
    on_surface_changed: Callable[[str, str], Coroutine[Any, Any, None]] | None
    on_resource_updated: ResourceUpdatedCallback | None
    tools_generation: int


class UpstreamListening:
    """The streams one upstream is followed on, and where their messages go."""

    def __init__(self, upstream: ListeningUpstream) -> None:
        self._upstream = upstream
        self._watch_scope = anyio.CancelScope()
        self._listen_scope = anyio.CancelScope()
        # Each per-client upstream session's GET stream holds a pooled connection: bounded (issue 22).
        self._streams = StreamBudget()
        self._follows: set[anyio.CancelScope] = set()  # every followed client stream, ended by aclose

    @property
    def followed_streams(self) -> int:
        """How many client sessions' GET streams are followed now (at most ``MAX_CLIENT_STREAMS``)."""
        return self._streams.held

    def close(self) -> None:
        """End every stream followed: the catalog's, each client's own, the listen stream."""
        self._watch_scope.cancel()
        for scope in list(self._follows):
            scope.cancel()
        self._listen_scope.cancel()

    async def on_stream_notification(
        self,
        method: str,
        params: dict[str, Any],
        relay: RequestRelay,
        upstream_session: HttpUpstreamSession | None = None,
    ) -> None:
        upstream = self._upstream
        if method == RESOURCE_UPDATED:
            # Never the calling request's: it goes to the subscribers of that URI (issue 9).
            self.resource_updated(params, upstream_session)
            return
        if method in SURFACE_LIST_CHANGED:
            if upstream.on_surface_changed is not None and upstream._task_group is not None:
                upstream._task_group.start_soon(upstream.on_surface_changed, upstream.name, method)
            return
        if method == "notifications/tools/list_changed":
            if upstream._on_list_changed is not None and upstream._task_group is not None:
                upstream._task_group.start_soon(upstream._on_list_changed, upstream.name)
            return
        await relay.on_notification(method, params)

    async def watch_subscriptions(self) -> None:
        """A sessionless upstream's ``tools/list_changed`` arrives on a ``subscriptions/listen`` stream."""
        with self._listen_scope:
            backoff = 0.5
            while True:
                with contextlib.suppress(UpstreamError, UpstreamReplied):
                    await self._upstream._wire.modern_request(
                        "subscriptions/listen", {"notifications": LIST_CHANGED_FILTER}, None, {}
                    )
                    backoff = 0.5
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def watch_catalog(self, catalog: HttpUpstreamSession) -> None:
        """Listen on the catalog session's GET stream for ``tools/list_changed``."""
        with self._watch_scope:
            await self.watch_catalog_forever(catalog)

    async def watch_catalog_forever(self, catalog: HttpUpstreamSession) -> None:
        upstream = self._upstream

        async def on_message(message: dict[str, Any]) -> None:
            await self.on_session_message(message, catalog)

        await follow_session_stream(
            upstream._client,
            upstream.url,
            upstream._wire.session_headers(catalog),
            on_message,
            max_event_bytes=upstream.spec.max_response_bytes,
        )

    async def on_session_message(
        self, message: dict[str, Any], upstream_session: HttpUpstreamSession
    ) -> None:
        """One message of an upstream session's GET stream: the catalog session's, or a client's own.

        A client's own session speaks to that client alone (issue 22): a request goes to one of its
        calls in flight there (its stream) or else to its GET stream, a log message likewise, and a
        list change refreshes its view and tells it; the catalog session's list changes reach every
        client that sees the namespace.
        """
        upstream = self._upstream
        method = message.get("method")
        raw = message.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if not isinstance(method, str):
            return
        own = not upstream_session.is_catalog
        if "id" in message:
            if own and upstream._task_group is not None:
                upstream._task_group.start_soon(
                    upstream._wire.answer_server_request,
                    message["id"],
                    method,
                    params,
                    self.owner_relay(upstream_session),
                    upstream_session,
                )
            return
        if method == RESOURCE_UPDATED:
            self.resource_updated(params, upstream_session)
        elif not own:
            if method == "notifications/tools/list_changed" and upstream._on_list_changed:
                upstream.tools_generation += 1
                await upstream._on_list_changed(upstream.name)
            elif method in SURFACE_LIST_CHANGED and upstream.on_surface_changed:
                await upstream.on_surface_changed(upstream.name, method)
        elif method == "notifications/tools/list_changed":
            upstream_session.tools = None
            if upstream_session.channel is not None:
                await upstream_session.channel.tools_changed(upstream.name)
        elif method in SURFACE_LIST_CHANGED:
            if upstream_session.channel is not None:
                await upstream_session.channel.notify(method, {})
        elif method == "notifications/progress":
            # Only the request that minted the token hears it (upstream/relay.py checks it again).
            token = params.get("progressToken")
            for relay in upstream_session.relays:
                if relay.upstream_token is not None and relay.upstream_token == token:
                    await relay.on_notification(method, params)
        elif method == TASK_STATUS:
            if upstream_session.channel is not None:
                await upstream_session.channel.task_status(upstream.name, params)
        elif method == "notifications/message":
            live = self.live_relay(upstream_session)
            if live is not None:
                await live.on_notification(method, params)  # at the level that call hears
            elif upstream_session.channel is not None:
                await upstream_session.channel.notify(method, params)

    @staticmethod
    def live_relay(upstream_session: HttpUpstreamSession) -> RequestRelay | None:
        """The latest request in flight on this session that has a client behind it."""
        for relay in reversed(upstream_session.relays):
            if relay.relay is not None:
                return relay
        return None

    def owner_relay(self, upstream_session: HttpUpstreamSession) -> RequestRelay:
        """Where a request from this session's GET stream is asked: a call of its owner in flight
        there, else the owner's GET stream, else nobody (the upstream is answered an error)."""
        live = self.live_relay(upstream_session)
        if live is not None:
            return live
        channel = upstream_session.channel
        return RequestRelay(ChannelRelay(channel) if channel is not None else None, None)

    async def follow_own_session(
        self, upstream_session: HttpUpstreamSession, *, wait_s: float = ACK_TIMEOUT_S
    ) -> None:
        """Follow this session's GET stream until the session closes; return once it is open.

        At most ``StreamBudget`` streams per upstream: past it the session is used unfollowed
        (what it sends outside a request is then lost, and logged once per session).
        """
        upstream = self._upstream
        if upstream._task_group is None or upstream_session.session_id is None:
            return  # a stateless upstream session has no GET stream
        if upstream_session.watch is not None:
            return
        if not self._streams.take():
            logger.warning("upstream %s: GET stream bound reached, a session goes unfollowed", upstream.name)
            return
        scope = upstream_session.watch = anyio.CancelScope()
        opened = anyio.Event()

        async def on_message(message: dict[str, Any]) -> None:
            await self.on_session_message(message, upstream_session)

        async def follow() -> None:
            try:
                with scope:
                    await follow_session_stream(
                        upstream._client,
                        upstream.url,
                        upstream._wire.session_headers(upstream_session),
                        on_message,
                        opened=opened,
                        max_event_bytes=upstream.spec.max_response_bytes,
                    )
            finally:
                self._follows.discard(scope)
                self._streams.give_back()

        self._follows.add(scope)
        upstream._task_group.start_soon(follow)
        with anyio.move_on_after(wait_s):
            await opened.wait()

    def resource_updated(self, params: dict[str, Any], upstream_session: HttpUpstreamSession | None) -> None:
        upstream = self._upstream
        uri = params.get("uri")
        if isinstance(uri, str) and upstream.on_resource_updated is not None:
            upstream.on_resource_updated(upstream.name, uri, upstream_session)
