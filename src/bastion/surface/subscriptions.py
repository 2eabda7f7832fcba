"""Who is subscribed to which resource, and where an upstream's update goes (issue 9; DESIGN section 5).

A :class:`Subscriber` is one session-era client session (updates go on its GET
stream) or one sessionless ``subscriptions/listen`` stream (updates go on that
stream). :class:`ResourceSubscriptions` belongs to one gateway and holds them by
``(server, upstream URI)``, so an update from an upstream reaches exactly the
subscribers of that URI on that server whose grants still cover it, and never
another session.

Upstream, a subscription lives where the upstream keeps one for the client:

- on the client's own upstream session (a session-era HTTP upstream): subscribed
  and unsubscribed per client; an update counts only for the subscriber whose
  upstream session it came on; closing the client session closes that upstream
  session and with it the subscription;
- shared by every client (a stdio process, a sessionless upstream's listen
  stream): counted here; subscribed upstream when the first subscriber arrives
  and unsubscribed when the last one leaves (unsubscribe, session end, stream end).

Nothing here is process-global; the grant decision and the audit entry are the
caller's (``subscribe.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from bastion.auth.principal import Principal
from bastion.errors import UpstreamError
from bastion.policy.decide import SurfaceKind, surface_visible
from bastion.policy.snapshot import Snapshot
from bastion.surface.uris import expose_uri
from bastion.upstream.base import CallContext, UpstreamReplied, UpstreamSessions
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["ResourceSubscriptions", "Subscriber", "close_upstream_sessions"]

logger = logging.getLogger(__name__)

ResourceKey = tuple[str, str]  # (server, upstream URI)


@dataclass(eq=False)
class Subscriber:
    """One client session or listen stream, and the resources it holds (``True``: a shared subscription)."""

    principal: Principal
    upstream_sessions: UpstreamSessions | None
    deliver: Callable[[dict[str, Any]], object]  # the params of one notifications/resources/updated
    held: dict[ResourceKey, bool] = field(default_factory=dict)


class ResourceSubscriptions:
    """Every resource subscription of one gateway; attaches itself to every upstream's updates."""

    def __init__(self, fleet: UpstreamFleet, snapshot: Callable[[], Snapshot]) -> None:
        self._fleet = fleet
        self._snapshot = snapshot
        self._by_resource: dict[ResourceKey, set[Subscriber]] = {}
        self._shared: set[ResourceKey] = set()  # held upstream for every client
        self._shared_lock = anyio.Lock()
        for upstream in fleet.upstreams.values():
            upstream.on_resource_updated = self.updated

    def subscribers(self, server: str, uri: str) -> int:
        return len(self._by_resource.get((server, uri), ()))

    async def subscribe(self, subscriber: Subscriber, server: str, uri: str, ctx: CallContext) -> None:
        """Hold ``uri`` of ``server`` for ``subscriber`` (again: nothing changes).

        Raises:
            UpstreamReplied, UpstreamError: the upstream refused or failed; nothing is held.
        """
        key = (server, uri)
        if key in subscriber.held:
            return
        upstream = self._fleet.upstreams[server]
        shared = upstream.shares_resource_feed(ctx)
        if shared:
            async with self._shared_lock:
                if key not in self._shared:
                    await upstream.subscribe_resource(uri, self._shared_context(server))
                    self._shared.add(key)
                self._hold(subscriber, key, shared=True)
            return
        await upstream.subscribe_resource(uri, ctx)
        self._hold(subscriber, key, shared=False)

    async def unsubscribe(self, subscriber: Subscriber, server: str, uri: str, ctx: CallContext) -> None:
        """Release ``uri`` of ``server`` for ``subscriber`` (held none: nothing happens)."""
        key = (server, uri)
        if key not in subscriber.held:
            return
        if subscriber.held[key]:
            await self._release_shared(subscriber, key)
            return
        self._drop(subscriber, key)
        try:
            await self._fleet.upstreams[server].unsubscribe_resource(uri, ctx)
        except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
            logger.warning("resources/unsubscribe on upstream %s failed: %s", server, exc)

    async def release_all(self, subscriber: Subscriber) -> None:
        """The subscriber ends (session closed, listen stream ended): shared subscriptions are counted
        down here; its own upstream sessions are closed by the caller, which ends the others."""
        with anyio.CancelScope(shield=True):
            for key, shared in list(subscriber.held.items()):
                if shared:
                    await self._release_shared(subscriber, key)
                else:
                    self._drop(subscriber, key)

    def updated(self, server: str, uri: str, upstream_session: Any) -> None:
        """An upstream says ``uri`` changed; ``upstream_session`` is the client's own session it came on,
        or None for a shared subscription. Never waits: delivery only queues."""
        upstream = self._fleet.upstreams.get(server)
        if upstream is None:
            return
        snapshot = self._snapshot()
        exposed = expose_uri(upstream.namespace, uri, transparent=self._fleet.is_transparent(server))
        if exposed is None:
            return
        for subscriber in list(self._by_resource.get((server, uri), ())):
            shared = subscriber.held.get((server, uri))
            if upstream_session is None:
                if not shared:
                    continue
            elif shared or subscriber.upstream_sessions is None:
                continue
            elif subscriber.upstream_sessions.get(server) is not upstream_session:
                continue  # another client's upstream session: never crosses
            # Grants may have narrowed since the subscription (a reload): decided again per update.
            if surface_visible(
                snapshot, subscriber.principal, SurfaceKind.RESOURCE, server, upstream.namespace, uri
            ):
                subscriber.deliver({"uri": exposed})

    def _hold(self, subscriber: Subscriber, key: ResourceKey, *, shared: bool) -> None:
        subscriber.held[key] = shared
        self._by_resource.setdefault(key, set()).add(subscriber)

    def _drop(self, subscriber: Subscriber, key: ResourceKey) -> None:
        subscriber.held.pop(key, None)
        holders = self._by_resource.get(key)
        if holders is not None:
            holders.discard(subscriber)
            if not holders:
                del self._by_resource[key]

    async def _release_shared(self, subscriber: Subscriber, key: ResourceKey) -> None:
        async with self._shared_lock:
            self._drop(subscriber, key)
            if any(other.held.get(key) for other in self._by_resource.get(key, ())):
                return  # someone else still needs it upstream
            self._shared.discard(key)
            server, uri = key
            try:
                await self._fleet.upstreams[server].unsubscribe_resource(uri, self._shared_context(server))
            except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
                logger.warning("releasing %s on upstream %s failed: %s", uri, server, exc)

    def _shared_context(self, server: str) -> CallContext:
        # A shared subscription is no client's request: no relay, no capabilities, no upstream session.
        snapshot = self._snapshot()
        timeout_s = snapshot.servers[server].timeout_s or snapshot.gateway.upstream_timeout_s
        return CallContext(relay=None, client_capabilities={}, timeout_s=timeout_s)


async def close_upstream_sessions(fleet: UpstreamFleet, holder: UpstreamSessions) -> None:
    """Close every upstream session ``holder`` opened (a listen stream's, when it ends)."""
    with anyio.CancelScope(shield=True):
        for upstream_session_server in holder.servers():
            upstream_session = holder.get(upstream_session_server)
            upstream = fleet.upstreams.get(upstream_session_server)
            if upstream is not None and upstream_session is not None:
                with anyio.move_on_after(5):
                    await upstream.close_session(upstream_session)
        holder.take_all()
