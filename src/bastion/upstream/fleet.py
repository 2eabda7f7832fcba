"""All configured upstreams and the one tool surface they make (DESIGN section 2, issue "one tool surface").

Owns: building each upstream from its spec, starting and stopping them, and
the namespaced tool catalog: every upstream tool exposed as
``<namespace><separator><tool>``, description, schemas and annotations
preserved. A name that would break the strictest common client rule
(``^[a-zA-Z0-9_-]{1,64}$``) is left out and reported, never mangled into a
name that could collide.

A client sees what each upstream shows a client with its capabilities (issue 22):
:meth:`UpstreamFleet.view_for`. A client with no capabilities an upstream could use
sees :attr:`UpstreamFleet.catalog`, listed for nobody; otherwise, in the session era,
the tools of its own upstream sessions, and in the sessionless era a catalog kept per
distinct capability set (at most ``MAX_CAPABILITY_SETS``, least recently used evicted,
rebuilt after any list change). A view merges like the catalog: a name keeps the
server that holds it there, a newcomer is left out (logged).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

import anyio
import anyio.abc

from bastion.background import BackgroundTasks
from bastion.errors import ConfigError, UpstreamError
from bastion.pinning.book import PinBook
from bastion.policy.snapshot import TOOL_NAME_RULE, ServerSpec, Snapshot, UpstreamKind
from bastion.store.pins import PinKind
from bastion.upstream.base import CallContext, Upstream, UpstreamHealth, UpstreamReplied, UpstreamSessions
from bastion.upstream.capability_sets import capability_key
from bastion.upstream.catalog import Collision, ToolEntry, all_collisions, exposed_name, merge_catalog
from bastion.upstream.health import HealthSchedule, UpstreamProber
from bastion.upstream.http_client import UpstreamHttp
from bastion.upstream.stdio import StdioUpstream
from bastion.upstream.stdio_pool import ProcessBudget
from bastion.upstream.streamable_http import HttpUpstream

__all__ = ["ToolEntry", "UpstreamFleet"]  # ToolEntry lives in upstream/catalog.py

logger = logging.getLogger(__name__)


NamespaceChanged = Callable[[str], Awaitable[None]]

# Distinct client capability sets whose catalog is kept at once (issue 22); the least recently
# used goes first. Each costs one listing per HTTP upstream when it is built.
MAX_CAPABILITY_SETS = 16


class UpstreamFleet:
    """The upstreams of one gateway process and their merged tool catalog."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        on_namespace_changed: NamespaceChanged | None = None,
        on_surface_changed: Callable[[str, str], Awaitable[None]] | None = None,
        on_process_event: Callable[[str, Any], None] | None = None,
        health_schedule: HealthSchedule | None = None,
    ) -> None:
        self._on_process_event = on_process_event
        self._snapshot = snapshot
        self._separator = snapshot.gateway.tool_separator
        self._on_namespace_changed = on_namespace_changed
        self._http = UpstreamHttp(read_timeout_s=snapshot.gateway.upstream_timeout_s)
        # Owned stdio processes over every server of this gateway (issue 22).
        self._process_budget = ProcessBudget.for_settings(snapshot.gateway)
        self.upstreams: dict[str, Upstream] = {
            name: self._build(spec) for name, spec in snapshot.servers.items()
        }
        self._on_surface_changed = on_surface_changed
        for upstream in self.upstreams.values():
            if isinstance(upstream, HttpUpstream | StdioUpstream):
                upstream.on_surface_changed = self._surface_changed
        self._tools_by_server: dict[str, list[ToolEntry]] = {name: [] for name in self.upstreams}
        self._catalog: Mapping[str, ToolEntry] = MappingProxyType({})
        self.skipped_tools: list[str] = []
        self._skipped_by_server: dict[str, list[str]] = {}
        # Tools left out because another server holds their exposed name (never shadowed).
        self.tool_collisions: list[Collision] = []
        # Prompts are one surface like tools (issue 9): namespaced, never shadowed.
        self._prompts_by_server: dict[str, list[ToolEntry]] = {name: [] for name in self.upstreams}
        self._prompt_catalog: Mapping[str, ToolEntry] = MappingProxyType({})
        self.prompt_collisions: list[Collision] = []
        self._refresh_lock = anyio.Lock()
        # Catalogs per client capability set (issue 22), valid for one catalog generation.
        self._views: OrderedDict[str, tuple[dict[str, list[ToolEntry]], Mapping[str, ToolEntry]]] = (
            OrderedDict()
        )
        self._view_lock = anyio.Lock()
        self.generation = 0  # rises whenever any server's tools are listed again
        self._background = BackgroundTasks()
        # Issue 27: every listing is admitted against its pins (pinning/book.py); None: unpinned.
        self.pins: PinBook | None = None
        # Active health for HTTP upstreams (issue #11): stdio processes are supervised instead.
        self.probers = {
            name: UpstreamProber(upstream, on_reconnected=self._list_changed, schedule=health_schedule)
            for name, upstream in self.upstreams.items()
            if isinstance(upstream, HttpUpstream)
        }

    def _build(self, spec: ServerSpec) -> Upstream:
        if spec.kind is UpstreamKind.HTTP:
            return HttpUpstream(spec, self._http, on_list_changed=self._list_changed)
        return StdioUpstream(
            spec,
            on_list_changed=self._list_changed,
            on_process_event=self._on_process_event,
            budget=self._process_budget,
        )

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start every upstream concurrently; their background work lives in ``task_group``."""
        async with anyio.create_task_group() as tg:
            for upstream in self.upstreams.values():
                tg.start_soon(upstream.start, task_group)
        async with anyio.create_task_group() as tg:
            for name in self.upstreams:
                tg.start_soon(self.refresh_server, name)
        # Refused at load: two servers that expose one name at start (see upstream/catalog.py).
        collisions = all_collisions(self._tools_by_server)
        if collisions:
            named = "; ".join(f"{c.name!r} from {c.holder} and {c.refused}" for c in collisions)
            raise ConfigError(f"servers: tool names collide: {named}")
        collisions = all_collisions(self._prompts_by_server)
        if collisions:
            named = "; ".join(f"{c.name!r} from {c.holder} and {c.refused}" for c in collisions)
            raise ConfigError(f"servers: prompt names collide: {named}")
        for prober in self.probers.values():
            self._background.start_soon(task_group, prober.run)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._background.cancel_and_wait()  # no probe after the HTTP client closes
            for upstream in self.upstreams.values():
                try:
                    await upstream.aclose()
                except Exception:
                    logger.exception("closing upstream %s failed", upstream.name)
            await self._http.aclose()

    # ------------------------------------------------------------------ catalog

    @property
    def catalog(self) -> Mapping[str, ToolEntry]:
        return self._catalog

    def lookup(self, exposed_name: str) -> ToolEntry | None:
        return self._catalog.get(exposed_name)

    @property
    def prompt_catalog(self) -> Mapping[str, ToolEntry]:
        return self._prompt_catalog

    def offers(self, server: str, capability: str) -> bool:
        """Whether ``server`` declared ``capability`` (``resources``, ``prompts``, ``completions``)."""
        capabilities = getattr(self.upstreams[server], "server_capabilities", None)
        return isinstance(capabilities, dict) and capability in capabilities

    def offers_subscribe(self, server: str) -> bool:
        """Whether ``server`` declared ``resources.subscribe`` (issue 9)."""
        capabilities = getattr(self.upstreams[server], "server_capabilities", None)
        resources = capabilities.get("resources") if isinstance(capabilities, dict) else None
        return isinstance(resources, dict) and resources.get("subscribe") is True

    def server_of_namespace(self, namespace: str) -> str | None:
        for name, upstream in self.upstreams.items():
            if upstream.namespace == namespace:
                return name
        return None

    def transparent_server(self) -> str | None:
        for name, spec in self._snapshot.servers.items():
            if spec.transparent:
                return name
        return None

    def is_transparent(self, server: str) -> bool:
        return self._snapshot.servers[server].transparent

    async def refresh_prompts(self, name: str) -> None:
        """Learn ``name``'s prompts (all pages) and merge them into the prompt catalog."""
        ctx = CallContext(
            relay=None, client_capabilities={}, timeout_s=self._snapshot.gateway.upstream_timeout_s
        )
        try:
            entries = await self._list_prompts(name, self.upstreams[name].call, ctx)
        except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
            logger.warning("listing prompts of upstream %s failed: %s", name, exc)
            return
        async with self._refresh_lock:
            self._prompts_by_server[name] = entries
            merged, self.prompt_collisions = merge_catalog(self._prompts_by_server, self._prompt_catalog)
            if self.prompt_collisions:
                logger.warning("prompt names collide, the newcomers are left out: %s", self.prompt_collisions)
            self._prompt_catalog = MappingProxyType(merged)

    async def prompt_view(self, ctx_for: Callable[[str], CallContext]) -> Mapping[str, ToolEntry]:
        """The prompts a client sees: the catalog's, except that an owned stdio server's are what the
        client's own process lists (started now if need be; issue 22). ``ctx_for(server)`` is the
        client's context for one server. Never raises for a server that fails to list: its catalog
        entries stand in."""
        owned = [
            name
            for name, upstream in self.upstreams.items()
            if isinstance(upstream, StdioUpstream)
            and upstream.owns_processes()
            and self.offers(name, "prompts")
        ]
        if not owned:
            return self._prompt_catalog
        prompts_by_server = dict(self._prompts_by_server)
        for name in owned:
            ctx = ctx_for(name)
            if ctx.owner_ref is None:
                continue
            upstream = self.upstreams[name]
            assert isinstance(upstream, StdioUpstream)
            try:
                prompts_by_server[name] = await self._list_prompts(name, upstream.process_for(ctx).call, ctx)
            except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
                logger.warning("listing prompts of upstream %s for a client failed: %s", name, exc)
        merged, collisions = merge_catalog(prompts_by_server, self._prompt_catalog)
        if collisions:
            logger.warning("prompt names collide in a client's view, newcomers left out: %s", collisions)
        return MappingProxyType(merged)

    async def _list_prompts(
        self,
        name: str,
        call: Callable[[str, dict[str, Any], CallContext], Awaitable[dict[str, Any]]],
        ctx: CallContext,
    ) -> list[ToolEntry]:
        """``name``'s prompts (all pages) as ``call`` lists them, as catalog entries."""
        upstream = self.upstreams[name]
        prompts: list[dict[str, Any]] = []
        if self.offers(name, "prompts"):
            cursor: str | None = None
            for _ in range(100):
                result = await call("prompts/list", {"cursor": cursor} if cursor else {}, ctx)
                page = result.get("prompts")
                if isinstance(page, list):
                    prompts.extend(p for p in page if isinstance(p, dict))
                cursor = result.get("nextCursor")
                if not isinstance(cursor, str) or not cursor:
                    break
        transparent = self.is_transparent(name)
        entries: list[ToolEntry] = []
        for prompt in prompts:
            if not isinstance(prompt.get("name"), str) or not prompt["name"]:
                continue
            exposed = exposed_name(
                upstream.namespace, self._separator, prompt["name"], transparent=transparent
            )
            entries.append(
                ToolEntry(
                    exposed_name=exposed,
                    server=name,
                    namespace=upstream.namespace,
                    upstream_name=prompt["name"],
                    definition=MappingProxyType({**prompt, "name": exposed}),
                )
            )
        return await self._pinned(name, PinKind.PROMPT, entries)  # issue 27

    async def refresh_server(self, name: str) -> None:
        upstream = self.upstreams[name]
        try:
            tools = await upstream.list_tools()
        except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
            logger.warning("listing tools of upstream %s failed: %s", name, exc)
            return
        await self.refresh_prompts(name)
        entries, skipped = self._entries(name, tools)
        entries = await self._pinned(name, PinKind.TOOL, entries)
        if skipped:
            logger.warning("upstream %s: tools left out, names break the client rule: %s", name, skipped)
        async with self._refresh_lock:
            self._tools_by_server[name] = entries
            merged, self.tool_collisions = merge_catalog(self._tools_by_server, self._catalog)
            if self.tool_collisions:
                logger.warning("tool names collide, the newcomers are left out: %s", self.tool_collisions)
            self._catalog = MappingProxyType(merged)
            # Per server: a prefix test would mix up namespaces `notes` and `notes_`, and a
            # transparent server's names have no prefix at all.
            self._skipped_by_server[name] = skipped
            self.skipped_tools = [tool for tools in self._skipped_by_server.values() for tool in tools]
            self.generation += 1
            self._views.clear()

    # ------------------------------------------------------------------ views (issue 22)

    async def view_for(
        self,
        client_capabilities: Mapping[str, Any],
        upstream_sessions: UpstreamSessions | None = None,
        *,
        log_level: str | None = None,
        owner: str | None = None,
        owner_ref: str | None = None,
        agent_session_id: str | None = None,
    ) -> Mapping[str, ToolEntry]:
        """The catalog a client sees: what each upstream shows a client with its capabilities.

        ``upstream_sessions`` is a session-era client's holder: its own upstream sessions
        are then asked (opened if need be), and the view is kept on the holder until a list
        changes. With ``owner_ref`` (the client's attachment reference), an owned stdio server's
        tools are what the client's own process lists, started now if it has none (issue 22).
        Never raises for an upstream that fails to list: its catalog entries stand in.
        """
        key = capability_key(client_capabilities)
        owned_stdio = owner_ref is not None and any(
            isinstance(u, StdioUpstream) and u.owns_processes() for u in self.upstreams.values()
        )
        own = owned_stdio or (
            upstream_sessions is not None
            and any(isinstance(u, HttpUpstream) and u.uses_own_session() for u in self.upstreams.values())
        )
        if not own:
            return self._catalog if not key else (await self._capability_view(key, client_capabilities))[1]
        cached = upstream_sessions.view if upstream_sessions is not None else None
        if isinstance(cached, tuple) and cached[0] == self.generation:
            view: Mapping[str, ToolEntry] = cached[1]
            return view
        generation = self.generation
        by_set = (await self._capability_view(key, client_capabilities))[0] if key else self._tools_by_server
        ctx = CallContext(
            relay=None,
            client_capabilities=client_capabilities,
            upstream_sessions=upstream_sessions,
            timeout_s=self._snapshot.gateway.upstream_timeout_s,
            log_level=log_level,
            client_answers_requests=upstream_sessions is not None,
            owner=owner,
            owner_ref=owner_ref,
            agent_session_id=agent_session_id,
        )
        tools_by_server = dict(by_set)

        async def list_own(name: str, upstream: Upstream) -> None:
            try:
                # One that is down keeps its catalog entries: a listing would only wait out its timeout.
                if (
                    isinstance(upstream, HttpUpstream)
                    and upstream_sessions is not None
                    and upstream.uses_own_session()
                    and upstream.health().connected
                ):
                    listed = self._entries(name, await upstream.list_tools_own(ctx))[0]
                    tools_by_server[name] = await self._pinned(name, PinKind.TOOL, listed)
                elif (
                    isinstance(upstream, StdioUpstream)
                    and upstream.owns_processes()
                    and owner_ref is not None
                ):
                    # The client's own process (started now, at the bounds like a call's): what it
                    # shows this client, before any call as after.
                    process = upstream.process_for(ctx)
                    listed = self._entries(name, await process.list_tools())[0]
                    tools_by_server[name] = await self._pinned(name, PinKind.TOOL, listed)
            except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
                logger.warning("listing tools of upstream %s for a client failed: %s", name, exc)

        async with anyio.create_task_group() as tg:  # a client's processes start side by side
            for name, upstream in self.upstreams.items():
                tg.start_soon(list_own, name, upstream)
        merged = self._merge_view(tools_by_server)
        if upstream_sessions is not None and upstream_sessions.view is cached:
            upstream_sessions.view = (generation, merged)
        return merged

    @property
    def capability_sets(self) -> tuple[str, ...]:
        """The keys of the capability sets whose catalog is kept, least recently used first."""
        return tuple(self._views)

    async def lookup_in_view(
        self,
        exposed: str,
        client_capabilities: Mapping[str, Any],
        upstream_sessions: UpstreamSessions | None = None,
        *,
        log_level: str | None = None,
        owner: str | None = None,
        owner_ref: str | None = None,
        agent_session_id: str | None = None,
    ) -> ToolEntry | None:
        """``exposed`` in the client's view (:meth:`view_for`): a tool only its capabilities show."""
        view = await self.view_for(
            client_capabilities,
            upstream_sessions,
            log_level=log_level,
            owner=owner,
            owner_ref=owner_ref,
            agent_session_id=agent_session_id,
        )
        return view.get(exposed)

    async def _capability_view(
        self, key: str, client_capabilities: Mapping[str, Any]
    ) -> tuple[dict[str, list[ToolEntry]], Mapping[str, ToolEntry]]:
        """The catalog kept for one capability set, built on first use (one listing per HTTP upstream)."""
        held = self._views.get(key)
        if held is not None:
            self._views.move_to_end(key)
            return held
        async with self._view_lock:
            held = self._views.get(key)
            if held is not None:
                return held
            generation = self.generation
            tools_by_server = dict(self._tools_by_server)
            for name, upstream in self.upstreams.items():
                if not isinstance(upstream, HttpUpstream) or not upstream.health().connected:
                    continue
                try:
                    tools = await upstream.list_tools_for(client_capabilities)
                except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
                    logger.warning("listing tools of upstream %s for a capability set failed: %s", name, exc)
                    continue
                tools_by_server[name] = await self._pinned(name, PinKind.TOOL, self._entries(name, tools)[0])
            held = (tools_by_server, self._merge_view(tools_by_server))
            if generation == self.generation:  # a list change while listing: serve it, keep nothing
                self._views[key] = held
                while len(self._views) > MAX_CAPABILITY_SETS:
                    self._views.popitem(last=False)
            return held

    def _merge_view(self, tools_by_server: Mapping[str, list[ToolEntry]]) -> Mapping[str, ToolEntry]:
        merged, collisions = merge_catalog(tools_by_server, self._catalog)
        if collisions:
            logger.warning("tool names collide in a client's view, newcomers left out: %s", collisions)
        return MappingProxyType(merged)

    def _entries(self, name: str, tools: list[dict[str, Any]]) -> tuple[list[ToolEntry], list[str]]:
        """``name``'s tools as catalog entries, and the exposed names left out (they break the rule)."""
        upstream = self.upstreams[name]
        entries: list[ToolEntry] = []
        skipped: list[str] = []
        for tool in tools:
            upstream_name = tool.get("name")
            if not isinstance(upstream_name, str):
                continue
            exposed = exposed_name(
                upstream.namespace,
                self._separator,
                upstream_name,
                transparent=self._snapshot.servers[name].transparent,
            )
            if not TOOL_NAME_RULE.match(exposed):
                skipped.append(exposed)
                continue
            entries.append(
                ToolEntry(
                    exposed_name=exposed,
                    server=name,
                    namespace=upstream.namespace,
                    upstream_name=upstream_name,
                    definition=MappingProxyType({**tool, "name": exposed}),
                )
            )
        return entries, skipped

    async def _pinned(self, server: str, kind: PinKind, entries: list[ToolEntry]) -> list[ToolEntry]:
        return entries if self.pins is None else await self.pins.admit(server, kind, entries)

    async def _surface_changed(self, server: str, method: str) -> None:
        """An upstream's prompts or resources changed: refresh the prompt catalog, then tell clients."""
        if method == "notifications/prompts/list_changed":
            await self.refresh_prompts(server)
        if self._on_surface_changed is not None:
            await self._on_surface_changed(server, method)

    async def pins_changed(self, server: str) -> None:
        """A pin of ``server`` was decided (here or at a replica): read its pins, list it again (issue 27)."""
        if self.pins is not None and server in self.upstreams:
            self.pins.forget(server)
            await self._list_changed(server)

    async def _list_changed(self, server: str) -> None:
        await self.refresh_server(server)
        if self._on_namespace_changed is not None:
            await self._on_namespace_changed(self.upstreams[server].namespace)

    async def agent_session_ended(self, agent: str, agent_session_id: str | None) -> None:
        """An agent session ended (revoked): the stdio processes it owned stop (issue 22)."""
        for upstream in self.upstreams.values():
            if isinstance(upstream, StdioUpstream):
                await upstream.agent_session_ended(agent, agent_session_id)

    def health(self) -> list[UpstreamHealth]:
        return [upstream.health() for upstream in self.upstreams.values()]

    def tools_of(self, server: str) -> list[ToolEntry]:
        return list(self._tools_by_server.get(server, []))
