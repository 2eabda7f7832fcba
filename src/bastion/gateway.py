"""One gateway process: the snapshot in force, the upstream fleet, the live transport sessions.

Owns start-up and shutdown order, closing a transport session (its upstream
sessions with it), expiring idle sessions, fanning ``tools/list_changed``
out to the sessions that see a namespace, and the readiness report. It holds
no process-global state: two :class:`Gateway` objects in one process are two
replicas.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from bastion.auth.bearer import StaticBearerAuth
from bastion.call import ToolCallPath
from bastion.methods import MethodRouter
from bastion.policy.snapshot import Snapshot
from bastion.session.registry import SessionRegistry
from bastion.session.state import TransportSession
from bastion.transport.jsonrpc import dumps
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["Gateway"]

logger = logging.getLogger(__name__)

_SWEEP_INTERVAL_S = 5.0


class Gateway:
    """Everything one gateway process serves with."""

    def __init__(self, snapshot: Snapshot, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot = snapshot
        self._auth = StaticBearerAuth(snapshot)
        self.registry = SessionRegistry(
            idle_timeout_s=snapshot.gateway.transport_session_idle_s,
            max_sessions=snapshot.gateway.max_transport_sessions,
            clock=clock,
        )
        self.fleet = UpstreamFleet(snapshot, on_namespace_changed=self.broadcast_tools_changed)
        self.call_path = ToolCallPath(self.fleet, self.snapshot)
        self.router = MethodRouter(self.fleet, self.call_path)
        self.started = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def auth(self) -> StaticBearerAuth:
        return self._auth

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group
        await self.fleet.start(task_group)
        task_group.start_soon(self._sweep_idle)
        self.started.set()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for transport_session in list(self.registry):
                await self.close_transport_session(transport_session, "shutdown")
            await self.fleet.aclose()

    async def close_transport_session(self, transport_session: TransportSession, reason: str) -> None:
        """End one client session: cancel its calls, close only its upstream sessions."""
        self.registry.remove(transport_session)
        for server in transport_session.upstream_sessions.servers():
            upstream_session = transport_session.upstream_sessions.get(server)
            upstream = self.fleet.upstreams.get(server)
            if upstream is not None and upstream_session is not None:
                with anyio.move_on_after(5, shield=True):
                    await upstream.close_session(upstream_session)
        transport_session.upstream_sessions.take_all()
        logger.info("transport session closed", extra={"reason": reason, "agent": transport_session.agent})

    async def broadcast_tools_changed(self, namespace: str) -> None:
        # Every session sees every namespace until per-agent grants (issue #4) narrow the surface.
        payload = dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        for transport_session in self.registry:
            transport_session.server_stream.publish(payload)

    async def _sweep_idle(self) -> None:
        while True:
            await anyio.sleep(_SWEEP_INTERVAL_S)
            for transport_session in self.registry.expired():
                await self.close_transport_session(transport_session, "idle_expiry")

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        upstreams = [
            {
                "name": h.name,
                "namespace": h.namespace,
                "kind": h.kind,
                "era": h.era,
                "connected": h.connected,
                "tools": h.tools,
                "detail": h.detail,
            }
            for h in self.fleet.health()
        ]
        ready = self.started.is_set() and all(u["connected"] for u in upstreams)
        return ready, {
            "ready": ready,
            "policy_version": self._snapshot.version,
            "transport_sessions": len(self.registry),
            "upstreams": upstreams,
            "skipped_tools": list(self.fleet.skipped_tools),
        }
