"""A stdio upstream: the processes of one configured stdio server, each with one owner (issue 22).

A stdio server is written for one client per process, so its process boundary
is its isolation (DESIGN section 5, seed 003). This module gives each owner
its own process, per ``servers.NAME.scope``:

- ``transport_session`` (the default): one process per client transport
  session (held in that session's ``UpstreamSessions``, stopped when the
  session ends: DELETE, idle expiry, revocation); a sessionless request's
  process is its agent session's (or its agent's, for a token without one);
- ``agent_session``: one process per agent session, in both eras;
- ``shared``: one process for every client (the operator's explicit choice).

Besides the owned processes, one listing process serves no client call (in
the owned scopes): it builds the gateway-wide catalog and answers readiness.
An owned process is started at its owner's first need, stopped when its owner
ends or after ``process_idle_s`` with no call, and bounded per server
(``max_processes``) and per gateway (``upstream/stdio_pool.py``): at a bound a
call is refused ``upstream_capacity``, never sent to a process of another
owner. It is initialized declaring only what its owner's client declared of
the capabilities Bastion bridges, and a crash restarts it for its owner alone.

Never: a request of one owner on another owner's process.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.abc

from bastion.errors import UpstreamCapacity, UpstreamUnavailable
from bastion.policy.snapshot import GatewaySettings, ProcessScope, ServerSpec
from bastion.upstream.base import (
    CallContext,
    ListChangedCallback,
    ResourceUpdatedCallback,
    SessionChannel,
    UpstreamEra,
    UpstreamHealth,
    UpstreamSessions,
)
from bastion.upstream.owner_channels import OwnerChannels
from bastion.upstream.stdio_counts import ProcessCounts
from bastion.upstream.stdio_pool import ProcessBudget
from bastion.upstream.stdio_process import StdioProcess, declared_for
from bastion.workers.attachment import sessionless_ref

__all__ = ["StdioProcess", "StdioUpstream"]

logger = logging.getLogger(__name__)

# Owner references of transport sessions (workers/attachment.transport_session_ref): a process
# with such an owner ends with that session; any other owner's outlives the holders it sits in.
_TRANSPORT_SESSION_REF = "ts_"


class StdioUpstream:
    """One configured stdio server: its listing process and its owners' processes."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        on_list_changed: ListChangedCallback | None = None,
        restart_backoff_s: tuple[float, float] = (0.1, 5.0),
        on_process_event: Any = None,
        budget: ProcessBudget | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.namespace = spec.namespace
        self.era = UpstreamEra.SESSION
        self.scope = spec.scope
        self._budget = budget if budget is not None else ProcessBudget.for_settings(GatewaySettings())
        self._backoff = restart_backoff_s
        self._on_process_event = on_process_event
        #: What this server's processes did, every one of them (``/metrics``).
        self.counts = ProcessCounts()
        # Builds the catalog; in the shared scope it is also every client's process.
        self.listing = StdioProcess(
            spec,
            on_list_changed=on_list_changed,
            restart_backoff_s=restart_backoff_s,
            on_process_event=on_process_event,
            counts=self.counts,
        )
        # One record per owner: its process, and the holders (client sessions) it sits in.
        self._by_owner: dict[str, StdioProcess] = {}
        self._held_in: dict[str, list[UpstreamSessions]] = {}
        self._resource_updated: ResourceUpdatedCallback | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._closing = False

    # ------------------------------------------------------------------ what the fleet reads

    @property
    def server_capabilities(self) -> dict[str, Any]:
        return self.listing.server_capabilities

    @property
    def on_surface_changed(self) -> Any:
        return self.listing.on_surface_changed

    @on_surface_changed.setter
    def on_surface_changed(self, callback: Any) -> None:
        self.listing.on_surface_changed = callback

    @property
    def on_resource_updated(self) -> ResourceUpdatedCallback | None:
        return self._resource_updated

    @on_resource_updated.setter
    def on_resource_updated(self, callback: ResourceUpdatedCallback | None) -> None:
        self._resource_updated = callback
        self.listing.on_resource_updated = callback
        for process in self._by_owner.values():
            process.on_resource_updated = callback

    @property
    def pid(self) -> int | None:
        """The listing process's PID (the shared scope: every client's)."""
        return self.listing.pid

    @property
    def restarts(self) -> int:
        return self.listing.restarts

    def health(self) -> UpstreamHealth:
        return self.listing.health()

    def processes_running(self) -> tuple[int, int]:
        """How many processes run now: ``(the listing one, 0 or 1; the owners')``."""
        owned = sum(1 for process in self._by_owner.values() if process.running)
        return (1 if self.listing.running else 0), owned

    def owns_processes(self) -> bool:
        """Whether each owner has its own process (every scope but ``shared``)."""
        return self.scope is not ProcessScope.SHARED

    def owned(self) -> dict[str, StdioProcess]:
        """The owned processes running now, by owner reference."""
        return dict(self._by_owner)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group
        await self.listing.start(task_group)
        if self.scope is not ProcessScope.SHARED:
            task_group.start_soon(self._reap_idle)

    async def aclose(self) -> None:
        self._closing = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for owner in list(self._by_owner):
                    tg.start_soon(self.owner_ended, owner)
            await self.listing.aclose()

    async def owner_ended(self, owner: str) -> None:
        """Stop ``owner``'s process, if it has one (its transport or agent session ended)."""
        process = self._by_owner.pop(owner, None)
        if process is None:
            return
        for holder in self._held_in.pop(owner, []):
            holder.drop(self.name, process)
        self._budget.give_back()
        await process.aclose()

    async def agent_session_ended(self, agent: str, agent_session_id: str | None) -> None:
        await self.owner_ended(sessionless_ref(agent, agent_session_id))

    async def _reap_idle(self) -> None:
        """Stop each owned process that has had no call for ``process_idle_s`` and holds no work
        (no call or parked round in flight, no resource subscription)."""
        idle_s = self.spec.process_idle_s
        while not self._closing:
            await anyio.sleep(max(0.05, min(idle_s / 4, 5.0)))
            now = anyio.current_time()
            for owner, process in list(self._by_owner.items()):
                if not process.holds_work() and now - process.last_used >= idle_s:
                    logger.info("upstream %s: an idle process is stopped", self.name)
                    await self.owner_ended(owner)

    # ------------------------------------------------------------------ requests

    def process_for(self, ctx: CallContext) -> StdioProcess:
        """The process that serves ``ctx``'s client: its owner's, started now if it has none.

        Raises:
            UpstreamCapacity: a process bound is reached (never another owner's process instead).
            UpstreamUnavailable: the gateway is stopping, or the client's session has ended.
        """
        if self.scope is ProcessScope.SHARED or ctx.owner_ref is None:
            return self.listing  # the shared scope, or the gateway's own request (no client)
        holder = ctx.upstream_sessions
        held = holder.get(self.name) if holder is not None else None
        if isinstance(held, StdioProcess) and self._by_owner.get(held.owner_ref or "") is held:
            return held
        owner = ctx.owner_ref
        if self.scope is ProcessScope.AGENT_SESSION:
            owner = sessionless_ref(ctx.owner or "", ctx.agent_session_id)
        process = self._by_owner.get(owner) or self._spawn(owner, ctx)
        if holder is not None and not holder.closed:
            holder.put(self.name, process)
            holder.view = None  # its tools/list now comes from this process (UpstreamFleet.view_for)
            # Holders that closed (a listen stream that ended) are let go here.
            self._held_in[owner] = [h for h in self._held_in.get(owner, []) if not h.closed] + [holder]
        return process

    def _spawn(self, owner: str, ctx: CallContext) -> StdioProcess:
        if self._closing or self._task_group is None:
            raise UpstreamUnavailable(f"upstream {self.name} is not running")
        if ctx.upstream_sessions is not None and ctx.upstream_sessions.closed:
            raise UpstreamUnavailable(f"upstream {self.name}: the client session has ended")
        try:
            self._budget.take(self.name, len(self._by_owner), self.spec.max_processes)
        except UpstreamCapacity as refused:
            self.counts.capacity_refusals[str(refused.data.get("bound", ""))] += 1
            raise
        process = StdioProcess(
            self.spec,
            restart_backoff_s=self._backoff,
            on_process_event=self._on_process_event,
            declared_capabilities=declared_for(ctx.client_capabilities),
            owner_ref=owner,
            spawn_gate=self._budget.spawn_gate,
            # Between calls it speaks to its owner's client sessions: a transport session's one, an
            # agent session's every one that used it (none for sessionless requests: dropped, logged).
            channel=OwnerChannels(self.name, lambda: self._channels_of(owner)),
            counts=self.counts,
        )
        process.on_resource_updated = self._resource_updated
        process.last_used = anyio.current_time()
        self._by_owner[owner] = process
        process.launch(self._task_group)
        return process

    def _channels_of(self, owner: str) -> list[SessionChannel]:
        """The live client sessions' channels that ``owner``'s process sits in, oldest first."""
        return [
            holder.channel
            for holder in self._held_in.get(owner, [])
            if not holder.closed and holder.channel is not None
        ]

    async def list_tools(self) -> list[dict[str, Any]]:
        return await self.listing.list_tools()

    async def call(self, method: str, params: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        return await self.process_for(ctx).call(method, params, ctx)

    async def close_session(self, upstream_session: Any) -> None:
        """A client session ends: its own process stops; an agent session's stays for its owner."""
        if not isinstance(upstream_session, StdioProcess) or upstream_session.owner_ref is None:
            return
        owner = upstream_session.owner_ref
        if owner.startswith(_TRANSPORT_SESSION_REF) and self._by_owner.get(owner) is upstream_session:
            await self.owner_ended(owner)

    async def notify_session(self, upstream_session: Any, method: str) -> None:
        """A client's ``roots/list_changed`` reaches its own process, and no other."""
        if isinstance(upstream_session, StdioProcess) and upstream_session.owner_ref is not None:
            await upstream_session.notify(method)

    # Resource subscriptions (issue 9): on the owner's process; counted by the gateway when shared.

    def shares_resource_feed(self, ctx: CallContext) -> bool:
        return self.scope is ProcessScope.SHARED or ctx.owner_ref is None or ctx.upstream_sessions is None

    async def subscribe_resource(self, uri: str, ctx: CallContext) -> None:
        await self.process_for(ctx).subscribe_resource(uri, ctx)

    async def unsubscribe_resource(self, uri: str, ctx: CallContext) -> None:
        await self.process_for(ctx).unsubscribe_resource(uri, ctx)
