"""The live transport sessions of one replica: closing one, ending one everywhere, sweeping the
idle ones, and what reaches them outside a request (list_changed, a client's notifications).

Closing a transport session closes its upstream sessions and its evidence session with it
(DESIGN section 1); never another client's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from bastion.audit.chain import CloseReason
from bastion.auth.principal import Principal
from bastion.errors import StoreError
from bastion.policy.decide import SurfaceKind, surface_reachable, visible_tools
from bastion.replica.host import ReplicaHost
from bastion.session.listeners import PROMPTS_LIST_CHANGED, RESOURCES_LIST_CHANGED, TOOLS_LIST_CHANGED
from bastion.session.state import TransportSession
from bastion.transport.jsonrpc import dumps
from bastion.workers.attachment import SurfaceChange, transport_session_ref

__all__ = ["LiveSessions"]

logger = logging.getLogger("bastion.gateway")

_SWEEP_INTERVAL_S = 5.0
# How long closing a session waits for its cancelled calls to record their outcome.
_CANCELLED_CALLS_GRACE_S = 10.0


class LiveSessions:
    """Ends and reaches the transport sessions in the gateway's :class:`SessionRegistry`."""

    def __init__(
        self, host: ReplicaHost, *, persist_surface: Callable[[SurfaceChange], Coroutine[Any, Any, None]]
    ) -> None:
        self._host = host
        self._persist_surface = persist_surface

    async def end_transport_session(self, transport_session: TransportSession, reason: str) -> None:
        """End a client session at every replica (DELETE, shared idle expiry), then close it here."""
        if self._host.shared is not None:
            shared = self._host.shared
            try:
                await shared.terminate(transport_session, reason)
            except StoreError as exc:
                # Owed: the termination is written when the store is back; until then this replica
                # has forgotten the session, and others still serve it (the client asked to end it).
                self._host.health.failed(exc, owed=lambda: shared.terminate(transport_session, reason))
        await self._host.close_transport_session(transport_session, reason)

    async def close_transport_session(self, transport_session: TransportSession, reason: str) -> None:
        """End one client session: cancel its calls, close only its upstream sessions, issue its claim.

        The evidence session closes only after the cancelled calls have recorded their
        outcome (``outcome_unknown`` when sent), so no entry is left without a chain.
        """
        host = self._host
        cancelled = host.registry.remove(transport_session)
        if host.router is not None:  # its resource subscriptions end with it (issue 9)
            await host.router.subscriptions.session_closed(transport_session)
        change = host.attachments.session_closed(transport_session_ref(transport_session.id))
        if change.detached and host.task_group is not None:
            host.task_group.start_soon(self._persist_surface, change)
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCELLED_CALLS_GRACE_S):
            for call in cancelled:
                await call.done.wait()
        for server in transport_session.upstream_sessions.servers():
            upstream_session = transport_session.upstream_sessions.get(server)
            upstream = host.fleet.upstreams.get(server)
            if upstream is not None and upstream_session is not None:
                with anyio.move_on_after(5, shield=True):
                    await upstream.close_session(upstream_session)
        transport_session.upstream_sessions.take_all()
        with anyio.CancelScope(shield=True):
            await host.close_evidence(transport_session.evidence, CloseReason(reason))
        logger.info("transport session closed", extra={"reason": reason, "agent": transport_session.agent})

    def pass_on_client_notification(self, transport_session: TransportSession, method: str) -> None:
        """A session-era client's ``roots/list_changed`` reaches its own upstream sessions, and no other."""
        task_group = self._host.task_group
        if task_group is None:
            return
        for server in transport_session.upstream_sessions.servers():
            upstream_session = transport_session.upstream_sessions.get(server)
            upstream = self._host.fleet.upstreams.get(server)
            if upstream is not None and upstream_session is not None:
                task_group.start_soon(upstream.notify_session, upstream_session, method)

    async def broadcast_tools_changed(self, namespace: str) -> None:
        """Tell the client sessions that see ``namespace`` (their grants cover one of its tools)."""
        host = self._host
        payload = dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        snapshot = host.snapshot()
        entries = [e for e in host.fleet.catalog.values() if e.namespace == namespace]
        for transport_session in host.registry:
            if visible_tools(snapshot, transport_session.principal, entries):
                transport_session.server_stream.publish(payload)
        host.listeners.publish(
            TOOLS_LIST_CHANGED,
            "notifications/tools/list_changed",
            lambda principal: bool(visible_tools(snapshot, principal, entries)),
        )

    async def broadcast_surface_changed(self, server: str, method: str) -> None:
        """Tell the client sessions (and listen streams) whose grants reach that server's prompts or
        resources that the list changed (issue 9)."""
        host = self._host
        prompts = method == "notifications/prompts/list_changed"
        kind = SurfaceKind.PROMPT if prompts else SurfaceKind.RESOURCE
        snapshot = host.snapshot()
        namespace = host.fleet.upstreams[server].namespace

        def sees(principal: Principal) -> bool:
            return surface_reachable(snapshot, principal, kind, server, namespace)

        payload = dumps({"jsonrpc": "2.0", "method": method})
        for transport_session in host.registry:
            if sees(transport_session.principal):
                transport_session.server_stream.publish(payload)
        host.listeners.publish(PROMPTS_LIST_CHANGED if prompts else RESOURCES_LIST_CHANGED, method, sees)

    async def sweep_idle(self) -> None:
        host = self._host
        while True:
            await anyio.sleep(_SWEEP_INTERVAL_S)
            if host.shared is not None:
                await host.shared.flush_touches()
            for transport_session in host.registry.expired():
                # Idle here; ended everywhere only if no other replica served it within the timeout.
                if host.shared is not None and await host.shared.idle_everywhere(transport_session):
                    await host.end_transport_session(transport_session, "idle_expiry")
                else:
                    await host.close_transport_session(transport_session, "idle_expiry")
