"""The MCP methods the gateway answers, after transport and authentication.

Owns the method table: ``ping``, ``server/discover`` (sessionless era),
``tools/list`` (the one namespaced surface), ``tools/call`` (``call.py``),
``logging/setLevel``, ``subscriptions/listen`` (sessionless era: the response
is the change-notification stream), and resources, prompts and completion
(``surface/``, issue 9); everything else is ``MethodNotFound``.
``initialize`` is the session handshake and lives in ``transport/``.

Each era has its own table: 2026-07-28 removed ``ping``, ``initialize`` and
``logging/setLevel`` (spec changelog, major change 5), and ``resources/subscribe``
/ ``resources/unsubscribe`` (a listen stream's ``resourceSubscriptions`` replace
them), so a sessionless request for them is ``MethodNotFound`` (HTTP 404 on that
wire), exactly as the reference servers answer; ``subscriptions/listen`` exists
only at 2026-07-28.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bastion import __version__
from bastion.auth.principal import Principal
from bastion.call import ToolCallPath
from bastion.call_telemetry import CallTelemetry
from bastion.caller import Caller
from bastion.errors import InvalidParams, MethodNotFound, MissingClientCapability
from bastion.policy.decide import visible_tools
from bastion.policy.snapshot import Snapshot
from bastion.session.listeners import ListenerHub, honored_filter
from bastion.session.state import TransportSession
from bastion.surface.apps import exposed_tool
from bastion.surface.capabilities import CapabilityRelay
from bastion.surface.completion import CompletionPath
from bastion.surface.prompts import PromptPath
from bastion.surface.resources import ResourcePath
from bastion.surface.subscribe import SubscribePath
from bastion.surface.subscriptions import ResourceSubscriptions
from bastion.tasks.support import TASKS_EXTENSION, asks_extension
from bastion.upstream.fleet import UpstreamFleet
from bastion.versions import SUPPORTED_VERSIONS, TASKS_VERSIONS

__all__ = ["SERVER_CAPABILITIES", "SERVER_INFO", "MethodRouter", "for_sessionless_wire"]

SERVER_INFO = {"name": "bastion", "version": __version__}
# Bastion's own: the merged, governed tool surface. The rest is relayed (surface/capabilities.py).
SERVER_CAPABILITIES: dict[str, Any] = {"tools": {"listChanged": True}}
# Methods that do not exist on the 2026-07-28 wire, and those that exist only there.
REMOVED_AT_MODERN: frozenset[str] = frozenset(
    {"ping", "initialize", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)
MODERN_ONLY: frozenset[str] = frozenset({"server/discover", "subscriptions/listen"})
# The 2025-11-25 task methods, and the 2026 tasks extension's (tasks/relay.py, issue 24).
SESSION_ERA_TASKS: frozenset[str] = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"})
EXTENSION_TASKS: frozenset[str] = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
SUBSCRIPTION_ID_META_KEY = "io.modelcontextprotocol/subscriptionId"
_LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

# Results the 2026-07-28 wire marks cacheable: they must carry ttlMs and cacheScope.
_CACHEABLE = frozenset(
    {
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    }
)


def for_sessionless_wire(method: str, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` as the sessionless era requires it: ``resultType`` always, cache hints where cacheable.

    Surfaces are per agent, so cached answers are ``private`` and, until list
    subscriptions exist, not reusable (``ttlMs`` 0).
    """
    shaped = {**result}
    shaped.setdefault("resultType", "complete")
    if method in _CACHEABLE:
        shaped.setdefault("ttlMs", 0)
        shaped.setdefault("cacheScope", "private")
    return shaped


Handler = Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]


#: Governed requests besides tools/call that call_telemetry.py counts and logs (tools/call: call.py);
#: the task methods too (issue 24).
_OBSERVED = (
    frozenset({"resources/read", "prompts/get", "completion/complete"}) | SESSION_ERA_TASKS | EXTENSION_TASKS
)


class MethodRouter:
    """Maps a JSON-RPC method to the code that answers it."""

    def __init__(
        self,
        fleet: UpstreamFleet,
        call_path: ToolCallPath,
        snapshot: Callable[[], Snapshot],
        *,
        on_surface: Callable[[TransportSession, frozenset[str]], None] | None = None,
        listeners: ListenerHub | None = None,
        telemetry: CallTelemetry | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._on_surface = on_surface
        self.listeners = listeners if listeners is not None else ListenerHub()
        self._snapshot = snapshot
        self._fleet = fleet
        self._call_path = call_path
        limits = call_path.surface_limits  # grant rate limits: the tool calls' limiters (issue 9)
        resources = ResourcePath(fleet, snapshot, limits, call_path.rounds)
        prompts = PromptPath(fleet, snapshot, limits, call_path.rounds)
        # Resource subscriptions (issue 9): per client session, or per listen stream.
        self.subscriptions = SubscribePath(fleet, snapshot, ResourceSubscriptions(fleet, snapshot), limits)
        self._capabilities = CapabilityRelay()  # issue 24: relayed as declared, reported once
        self._handlers: dict[str, Handler] = {
            "ping": self._ping,
            "server/discover": self._discover,
            "tools/list": self._tools_list,
            "tools/call": self._call_path.call_tool,
            "logging/setLevel": self._set_level,
            "resources/list": resources.list_resources,
            "resources/templates/list": resources.list_templates,
            "resources/read": resources.read,
            "resources/subscribe": self.subscriptions.subscribe,
            "resources/unsubscribe": self.subscriptions.unsubscribe,
            "prompts/list": prompts.list_prompts,
            "prompts/get": prompts.get,
            "completion/complete": CompletionPath(fleet, snapshot, prompts, limits).complete,
            "tasks/get": call_path.tasks.get,
            "tasks/result": call_path.tasks.result,
            "tasks/list": call_path.tasks.list_tasks,
            "tasks/cancel": call_path.tasks.cancel,
        }
        tasks = call_path.tasks
        self._extension_handlers: dict[str, Handler] = {
            "tasks/get": tasks.get_detailed,
            "tasks/update": tasks.update,
            "tasks/cancel": tasks.cancel_requested,
        }

    def capabilities_for(self, principal: Principal, protocol_version: str) -> dict[str, Any]:
        """What this principal is told the gateway offers at ``protocol_version`` (resources etc. only
        where it may see some; ``tasks`` only at a revision that has them)."""
        relayed = self._capabilities.capabilities_for(self._fleet, self._snapshot(), principal)
        if protocol_version not in TASKS_VERSIONS:
            relayed.pop("tasks", None)
        return {**SERVER_CAPABILITIES, **relayed}

    async def dispatch(
        self, caller: Caller, method: str, params: dict[str, Any], request_id: str | int | None = None
    ) -> dict[str, Any]:
        """Answer one request.

        Raises:
            MethodNotFound: the method is not served, or does not exist in the caller's era.
            BastionError: whatever the handler refuses with.
        """
        sessionless = caller.transport_session is None
        if method in SESSION_ERA_TASKS or method in EXTENSION_TASKS:
            handler = self._task_handler(caller, method, params)
        elif sessionless and method in REMOVED_AT_MODERN:
            raise MethodNotFound(
                f"Method not found: {method} does not exist at protocol version {caller.protocol_version}",
                method=method,
            )
        elif method == "subscriptions/listen" and sessionless:
            return await self._listen(caller, params, request_id)
        else:
            found = self._handlers.get(method)
            if found is None or (not sessionless and method in MODERN_ONLY):
                raise MethodNotFound(f"Method not found: {method}", method=method)
            handler = found
        if self._telemetry is not None and method in _OBSERVED:
            return await self._telemetry.request(method, str(caller.agent), lambda: handler(caller, params))
        return await handler(caller, params)

    def _task_handler(self, caller: Caller, method: str, params: dict[str, Any]) -> Handler:
        """Which wire's ``tasks/*`` answers (``tasks/relay.py``): the extension's for a request that
        negotiated it, else the 2025-11-25 revision's for a session that has them.

        Raises:
            MethodNotFound: no server this principal sees offers that wire's method (or the era has
                none: sessionless ``tasks/result`` and ``tasks/list``), as from a server without it.
            MissingClientCapability: the extension's method, from a request that did not negotiate
                the extension (-32021, as the server itself answers).
        """
        offered = self.capabilities_for(caller.principal, caller.protocol_version)
        extension = TASKS_EXTENSION in (offered.get("extensions") or {})
        if extension and method in EXTENSION_TASKS:
            if asks_extension(caller.client_capabilities, params):
                return self._extension_handlers[method]
            if caller.transport_session is None or method == "tasks/update" or "tasks" not in offered:
                raise MissingClientCapability(
                    f"{method} needs the {TASKS_EXTENSION} extension, which this request did not negotiate",
                    requiredCapabilities={"extensions": {TASKS_EXTENSION: {}}},
                )
        if caller.transport_session is not None and method in SESSION_ERA_TASKS and "tasks" in offered:
            return self._handlers[method]
        if caller.transport_session is None:
            raise MethodNotFound(
                f"Method not found: {method} does not exist at protocol version {caller.protocol_version}",
                method=method,
            )
        # No server this principal sees offers tasks, or the revision has none: not served.
        raise MethodNotFound(f"Method not found: {method}", method=method)

    async def _ping(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def _discover(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        # The session era's tasks capability: not what a 2026 client can use (tasks/relay.py).
        capabilities = self.capabilities_for(caller.principal, caller.protocol_version)
        return {
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": capabilities,
            "instructions": "Bastion gateway: tools are named <namespace>__<tool>.",
            "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
        }

    async def _tools_list(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        # One page: the surface is the gateway's own merged catalog, already in memory,
        # narrowed to the tools this principal's grants cover in the snapshot in force.
        # What each upstream shows a client with this client's capabilities (issue 22).
        transport_session = caller.transport_session
        catalog = await self._fleet.view_for(
            caller.client_capabilities,
            transport_session.upstream_sessions if transport_session is not None else None,
            log_level=caller.log_level if transport_session is None else transport_session.log_level,
            owner=str(caller.agent),
            owner_ref=caller.owner_ref,
            agent_session_id=caller.principal.agent_session_id,
        )
        visible = visible_tools(self._snapshot(), caller.principal, catalog.values())
        if caller.transport_session is not None:
            surface = frozenset(entry.namespace for entry in visible)
            caller.transport_session.surface_namespaces = surface
            if self._on_surface is not None:
                self._on_surface(caller.transport_session, surface)
        return {
            "tools": [
                exposed_tool(
                    entry.definition, entry.namespace, transparent=self._fleet.is_transparent(entry.server)
                )
                for entry in visible
            ]
        }

    async def _set_level(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        level = params.get("level")
        if level not in _LOG_LEVELS:
            raise InvalidParams("Invalid params: logging/setLevel needs a valid level")
        if caller.transport_session is not None:
            caller.transport_session.log_level = level
        return {}

    async def _listen(
        self, caller: Caller, params: dict[str, Any], request_id: str | int | None
    ) -> dict[str, Any]:
        """Serve one listen stream until the client closes it (a cancel) or the gateway ends it.

        The acknowledgment goes first and names only what is delivered here
        (the list kinds, and the ``resourceSubscriptions`` this caller may
        see, subscribed upstream before the acknowledgment: issue 9); every
        frame carries the listen request's id as ``subscriptionId``. A
        graceful end answers the final result with the same ``_meta``.
        """
        requested = params.get("notifications")
        if not isinstance(requested, dict) or request_id is None or caller.relay is None:
            raise InvalidParams("Invalid params: subscriptions/listen needs a notifications filter")
        meta = {SUBSCRIPTION_ID_META_KEY: request_id}
        honored = honored_filter(requested)
        with self.listeners.open(caller.principal, frozenset(honored)) as stream:
            async with self.subscriptions.listening(
                caller, requested.get("resourceSubscriptions"), stream.deliver
            ) as uris:
                if uris:
                    honored["resourceSubscriptions"] = uris
                await caller.relay.notify(
                    "notifications/subscriptions/acknowledged", {"_meta": meta, "notifications": honored}
                )
                async for method, event in stream.events:
                    await caller.relay.notify(method, {**event, "_meta": meta})
        return {"_meta": meta}
