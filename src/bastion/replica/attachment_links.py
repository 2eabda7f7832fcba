"""Attachment at one replica (DESIGN section 6): which namespaces a live session's surface holds,
the ownership records written for them off the call path, and the sanctioned re-attach.

A background record never takes the gateway down; a superseded or closing worker writes none.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from bastion.auth.principal import Principal
from bastion.errors import StoreError
from bastion.ids import WorkerId
from bastion.policy.decide import visible_tools
from bastion.policy.snapshot import ProcessScope
from bastion.replica.host import ReplicaHost
from bastion.session.state import TransportSession
from bastion.transport.jsonrpc import dumps
from bastion.upstream.stdio import StdioUpstream
from bastion.workers.attachment import SurfaceChange, persist_surface_change, transport_session_ref

__all__ = ["AttachmentLinks"]

logger = logging.getLogger("bastion.gateway")


class AttachmentLinks:
    """The gateway's side of :class:`AttachmentTracker`: its health probe, re-attach and records."""

    def __init__(self, host: ReplicaHost) -> None:
        self._host = host

    def namespace_connected(self, namespace: str) -> bool | None:
        for upstream in self._host.fleet.upstreams.values():
            if upstream.namespace == namespace:
                return upstream.health().connected
        return None

    def surface_listed(self, transport_session: TransportSession, namespaces: frozenset[str]) -> None:
        host = self._host
        change = host.attachments.surface_listed(transport_session_ref(transport_session.id), namespaces)
        if (change.attached or change.detached) and host.task_group is not None:
            # Ownership records (which live session uses which worker) are written off the call path.
            host.task_group.start_soon(self.persist_surface, change)

    async def persist_surface(self, change: SurfaceChange) -> None:
        host = self._host
        if host.store is None or host.membership is None or host.membership.superseded:
            return
        if host.background.closed:
            return  # shutting down: this worker's liveness ends, and with it what its records prove
        worker, epoch = host.membership.credentials()

        def worker_for(namespace: str) -> WorkerId | None:
            for name, upstream in host.fleet.upstreams.items():
                if upstream.namespace == namespace:
                    if isinstance(upstream, StdioUpstream) and upstream.scope is not ProcessScope.SHARED:
                        return None  # its processes' owners are recorded as they start (runtimes.py)
                    runtime = host.runtimes.current(name) if host.runtimes is not None else None
                    return runtime.worker if runtime is not None else worker
            return None

        try:
            await persist_surface_change(
                host.store, change, worker_for=worker_for, writer=worker, epoch=epoch, now=datetime.now(UTC)
            )
        except StoreError as exc:
            logger.warning("attachment records not written: %s", exc.message)
        except Exception:  # a background record must never take the gateway down
            logger.exception("attachment records not written")

    async def reattach(self, ref: str, namespace: str) -> frozenset[str]:
        """The sanctioned re-attach: re-initialize that session's upstream session, refresh the surface."""
        host = self._host
        transport_session = next((t for t in host.registry if transport_session_ref(t.id) == ref), None)
        server = next((n for n, u in host.fleet.upstreams.items() if u.namespace == namespace), None)
        owner = host.attachments.owner_of(ref)
        if transport_session is None and server is not None and isinstance(owner, Principal):
            # A sessionless agent has no upstream session to re-initialize: refresh the namespace's
            # tools and list them for that agent (issue #11 point 2).
            await host.fleet.refresh_server(server)
            visible = visible_tools(host.snapshot(), owner, host.fleet.catalog.values())
            return frozenset(entry.namespace for entry in visible)
        if transport_session is None or server is None:
            raise RuntimeError("unknown transport session or namespace")
        stale = transport_session.upstream_sessions.get(server)
        if stale is not None:
            transport_session.upstream_sessions.drop(server, stale)
            await host.fleet.upstreams[server].close_session(stale)
        await host.fleet.refresh_server(server)
        visible = visible_tools(host.snapshot(), transport_session.principal, host.fleet.catalog.values())
        surface = frozenset(entry.namespace for entry in visible)
        transport_session.surface_namespaces = surface
        transport_session.server_stream.publish(
            dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        )
        return surface
