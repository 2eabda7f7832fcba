"""What a principal is told the gateway offers: the union of its visible servers' own (issues 9, 24).

Advertised at ``initialize`` and in ``server/discover``. Bastion's own surface is always there
(``tools``, with ``listChanged``: the merged catalog changes on reload and upstream recovery).
Everything else is relayed as the upstreams declared it, and only from servers some grant of
this principal names (all of them when no grants are declared):

* ``resources``, ``prompts``, ``completions`` where such a server could show this principal
  something under its grants (``surface_reachable``); ``logging`` where such a server logs;
* ``tasks`` (2025-11-25) where such a server lets tool calls become tasks: the part the gateway
  relays (tool calls, ``list``, ``cancel`` as declared; ``tasks/relay.py``); ``methods.py`` keeps it
  only for a client that negotiated a revision with tasks (``versions.TASKS_VERSIONS``);
* ``extensions`` (SEP-2133) that Bastion governs (``GOVERNED_EXTENSIONS``: MCP Apps, and the 2026
  tasks extension, relayed by ``tasks/relay.py``). Any other extension,
  and ``experimental`` declarations, are filtered out with one log line per server
  and name (``CapabilityRelay``), never passed through unexamined.

Why filtered, not refused at start: an upstream's capabilities are learned from the upstream at
connect (and again after a reconnect or an upgrade), not declared in the operator's policy, and
refusing the server would take away its governed tools as well. An extension may add request
methods (``Extension.methods()``) that the gateway would not route, authorize or audit: one the
gateway has not been taught stays unannounced, so a client never relies on it.

Reads the fleet's learned upstream capabilities and the snapshot; it never calls an upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from bastion.auth.principal import Principal
from bastion.policy.decide import SurfaceKind, server_visible, surface_reachable
from bastion.policy.snapshot import Snapshot
from bastion.tasks.relay import relayed_tasks_capability
from bastion.tasks.support import TASKS_EXTENSION
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["GOVERNED_EXTENSIONS", "CapabilityRelay", "surface_capabilities"]

logger = logging.getLogger(__name__)

# Extension id -> why the gateway governs all of its traffic.
GOVERNED_EXTENSIONS: Final[Mapping[str, str]] = {
    # MCP Apps: a tool's _meta.ui.resourceUri names a ui:// resource, read with resources/read
    # under the principal's resource grants; the extension adds no request method.
    "io.modelcontextprotocol/ui": "tools and ui:// resources, under tool and resource grants",
    # Tasks (SEP-2663): a call that becomes a task is admitted and audited as a call; tasks/get,
    # tasks/update and tasks/cancel reach only the owner's task at its server (tasks/relay.py).
    TASKS_EXTENSION: "tool calls that become tasks, and the owner's tasks/get, update and cancel",
}
# Declarations no grant governs yet: relayed never, reported once.
_UNGOVERNED_KEYS: Final[tuple[str, ...]] = ("experimental",)


class CapabilityRelay:
    """One gateway's view of what to relay; remembers which filtered declarations it has reported.

    Per gateway (two gateways share a process in tests), so each reports on its own.
    """

    def __init__(self) -> None:
        self._reported: set[tuple[str, str]] = set()

    def capabilities_for(
        self, fleet: UpstreamFleet, snapshot: Snapshot, principal: Principal
    ) -> dict[str, Any]:
        """The relayed entries (everything but Bastion's own ``tools``) for this principal."""
        offered = surface_capabilities(fleet, snapshot, principal)
        extensions: dict[str, dict[str, Any]] = {}
        tasks: dict[str, Any] = {}
        logs = False
        for server, upstream in fleet.upstreams.items():
            if not server_visible(snapshot, principal, server, upstream.namespace):
                continue
            declared = getattr(upstream, "server_capabilities", None)
            if not isinstance(declared, dict):
                continue
            logs = logs or "logging" in declared
            relayed_tasks = relayed_tasks_capability(declared)
            if relayed_tasks is not None:
                tasks.update(relayed_tasks)
            elif "tasks" in declared:
                self._report(
                    server, "tasks", "tasks the gateway does not relay (no task-augmented tool calls)"
                )
            for key in _UNGOVERNED_KEYS:
                if key in declared:
                    self._report(server, key, "a capability the gateway does not govern")
            discovered = getattr(upstream, "discovered_capabilities", None)
            both = {**_declared_extensions(discovered), **_declared_extensions(declared)}
            for name, settings in both.items():
                if name not in GOVERNED_EXTENSIONS:
                    self._report(server, name, "an extension the gateway does not govern")
                elif name not in extensions:
                    extensions[name] = settings
                elif extensions[name] != settings:
                    self._report(server, name, "settings that differ from another server's (the first kept)")
        if logs:
            offered["logging"] = {}
        if extensions:
            offered["extensions"] = extensions
        if tasks:
            offered["tasks"] = tasks
        return offered

    def _report(self, server: str, name: str, what: str) -> None:
        if (server, name) in self._reported:
            return
        self._reported.add((server, name))
        logger.warning(
            "upstream %s declares %s, %s: not relayed to clients",
            server,
            name,
            what,
            extra={"server": server, "declaration": name},
        )


def _declared_extensions(declared: object) -> dict[str, dict[str, Any]]:
    extensions = declared.get("extensions") if isinstance(declared, dict) else None
    if not isinstance(extensions, dict):
        return {}
    return {name: dict(settings) for name, settings in extensions.items() if isinstance(settings, dict)}


def surface_capabilities(fleet: UpstreamFleet, snapshot: Snapshot, principal: Principal) -> dict[str, Any]:
    """``resources``, ``prompts`` and ``completions`` entries for this principal's capabilities."""
    reachable: set[SurfaceKind] = set()
    completions = subscribe = False
    for server, upstream in fleet.upstreams.items():
        here = {
            kind
            for kind, capability in ((SurfaceKind.RESOURCE, "resources"), (SurfaceKind.PROMPT, "prompts"))
            if fleet.offers(server, capability)
            and surface_reachable(snapshot, principal, kind, server, upstream.namespace)
        }
        reachable |= here
        subscribe = subscribe or (SurfaceKind.RESOURCE in here and fleet.offers_subscribe(server))
        completions = completions or (bool(here) and fleet.offers(server, "completions"))
    offered: dict[str, Any] = {}
    if SurfaceKind.RESOURCE in reachable:
        offered["resources"] = {"listChanged": True, **({"subscribe": True} if subscribe else {})}
    if SurfaceKind.PROMPT in reachable:
        offered["prompts"] = {"listChanged": True}
    if completions:
        offered["completions"] = {}
    return offered
