"""``resources/subscribe``, ``resources/unsubscribe``, a listen stream's ``resourceSubscriptions`` (issue 9).

Governed like a read (``resources.py``): (4) the URI is routed and decided against
the snapshot in force, a hidden resource answered exactly like one nobody serves
(``UnknownResource``; a listen stream leaves either out of its acknowledgment);
(7) the subscription is made upstream where it belongs (``subscriptions.py``);
(8) one audit entry per URI (decision, digests), written before the answer.

Session era: the subscriber is the client's transport session, and its updates go
on that session's GET stream. Sessionless era (2026-07-28): ``resources/subscribe``
does not exist; the subscriber is one ``subscriptions/listen`` stream, which names
its URIs in ``resourceSubscriptions`` and gets the updates on itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from bastion.caller import Caller
from bastion.errors import BastionError, InvalidParams, RateLimited, UnknownResource
from bastion.policy.snapshot import Snapshot
from bastion.session.state import TransportSession
from bastion.surface.limits import SurfaceLimits
from bastion.surface.relay import AccessRecord, decide_resource, run_recorded, upstream_context
from bastion.surface.subscriptions import ResourceSubscriptions, Subscriber, close_upstream_sessions
from bastion.upstream.base import RESOURCE_UPDATED, UpstreamReplied, UpstreamSessions
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["MAX_LISTEN_RESOURCES", "SubscribePath"]

# URIs one listen stream may name: each may hold an upstream subscription.
MAX_LISTEN_RESOURCES = 64


class SubscribePath:
    """Subscribes callers to resources against the snapshot in force."""

    def __init__(
        self,
        fleet: UpstreamFleet,
        snapshot: Callable[[], Snapshot],
        subscriptions: ResourceSubscriptions,
        limits: SurfaceLimits | None = None,
    ) -> None:
        self._fleet = fleet
        self._snapshot = snapshot
        self._limits = limits
        self._subscriptions = subscriptions
        self._by_session: dict[TransportSession, Subscriber] = {}

    async def subscribe(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """Subscribe the caller's session to one resource.

        Raises:
            InvalidParams: no string ``uri``.
            UnknownResource: no server the caller may see serves it (audited).
            UpstreamReplied: the upstream refused (relayed verbatim).
            UpstreamError: the upstream failed.
        """
        return await self._change(caller, params, "resources/subscribe")

    async def unsubscribe(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """End the caller's session's subscription to one resource (none held: still an empty result).

        Raises:
            InvalidParams: no string ``uri``.
            UnknownResource: no server the caller may see serves it (audited). The updates of a
                resource hidden since its subscription stop anyway; session end releases it.
        """
        return await self._change(caller, params, "resources/unsubscribe")

    async def _change(self, caller: Caller, params: dict[str, Any], method: str) -> dict[str, Any]:
        snapshot = self._snapshot()
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise InvalidParams(f"Invalid params: {method} needs a string uri")
        record = AccessRecord(caller, method, params, snapshot)
        # (4) Grant decision: hidden is answered as unknown; the audit keeps grant_denied.
        server, target = await decide_resource(self._fleet, snapshot, caller, uri, record, self._limits)
        subscriber = self._session_subscriber(caller)
        ctx = upstream_context(caller, snapshot, server)
        change = (
            self._subscriptions.subscribe
            if method == "resources/subscribe"
            else self._subscriptions.unsubscribe
        )

        async def send() -> dict[str, Any]:
            await change(subscriber, server, target.uri, ctx)
            return {}

        # (7) Change the subscription where it belongs upstream; (8) the entry, then the answer.
        return await run_recorded(record, send)

    def subscribers(self, server: str, uri: str) -> int:
        """How many sessions and listen streams hold ``uri`` of ``server`` (an upstream URI)."""
        return self._subscriptions.subscribers(server, uri)

    async def session_closed(self, transport_session: TransportSession) -> None:
        """The session ended: what it held shared is counted down (its own upstream sessions close after)."""
        subscriber = self._by_session.pop(transport_session, None)
        if subscriber is not None:
            await self._subscriptions.release_all(subscriber)

    @contextlib.asynccontextmanager
    async def listening(
        self, caller: Caller, requested: Any, deliver: Callable[[str, dict[str, Any]], None]
    ) -> AsyncIterator[list[str]]:
        """Subscribe one listen stream to the URIs it names; yields the ones honored.

        A URI that is unknown, hidden, or refused upstream is left out of the acknowledgment
        (each audited). Everything is released when the stream ends.

        Raises:
            InvalidParams: ``resourceSubscriptions`` is not a list of at most 64 strings.
        """
        if requested is None:
            yield []
            return
        if (
            not isinstance(requested, list)
            or len(requested) > MAX_LISTEN_RESOURCES
            or not all(isinstance(uri, str) for uri in requested)
        ):
            raise InvalidParams(
                f"Invalid params: resourceSubscriptions must be a list of at most {MAX_LISTEN_RESOURCES} URIs"
            )
        snapshot = self._snapshot()
        holder = UpstreamSessions()  # the stream's own upstream sessions, where one is needed
        subscriber = Subscriber(caller.principal, holder, lambda p: deliver(RESOURCE_UPDATED, p))
        honored: list[str] = []
        try:
            for uri in dict.fromkeys(requested):
                if await self._listen_one(caller, snapshot, subscriber, uri):
                    honored.append(uri)
            yield honored
        finally:
            await self._subscriptions.release_all(subscriber)
            await close_upstream_sessions(self._fleet, holder)

    async def _listen_one(self, caller: Caller, snapshot: Snapshot, subscriber: Subscriber, uri: str) -> bool:
        record = AccessRecord(caller, "subscriptions/listen", {"uri": uri}, snapshot)
        try:
            server, target = await decide_resource(self._fleet, snapshot, caller, uri, record, self._limits)
        except (UnknownResource, RateLimited):
            return False
        ctx = upstream_context(caller, snapshot, server)
        upstream = self._fleet.upstreams[server]
        if not upstream.shares_resource_feed(ctx):
            # A session-era upstream: the stream gets its own upstream session, closed when it ends.
            ctx = dataclasses.replace(ctx, upstream_sessions=subscriber.upstream_sessions)

        async def send() -> dict[str, Any]:
            await self._subscriptions.subscribe(subscriber, server, target.uri, ctx)
            return {}

        try:
            await run_recorded(record, send)
        except (BastionError, UpstreamReplied):
            return False
        return True

    def _session_subscriber(self, caller: Caller) -> Subscriber:
        transport_session = caller.transport_session
        if transport_session is None:  # the method table routes only session-era callers here
            raise InvalidParams("Invalid params: resources/subscribe needs a session")
        subscriber = self._by_session.get(transport_session)
        if subscriber is None:
            stream = transport_session.server_stream
            subscriber = Subscriber(
                transport_session.principal,
                transport_session.upstream_sessions,
                lambda p: stream.publish(
                    orjson.dumps({"jsonrpc": "2.0", "method": RESOURCE_UPDATED, "params": p})
                ),
            )
            self._by_session[transport_session] = subscriber
        return subscriber
