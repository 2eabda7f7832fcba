"""The MCP methods the gateway answers, after transport and authentication.

Owns the method table: ``ping``, ``server/discover`` (sessionless era),
``tools/list`` (the one namespaced surface), ``tools/call`` (``call.py``),
``logging/setLevel``; everything else is ``MethodNotFound`` with a clear
message (resources and prompts follow in a later issue). ``initialize`` is
the session handshake and lives in ``transport/``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bastion import __version__
from bastion.call import ToolCallPath
from bastion.caller import Caller
from bastion.errors import InvalidParams, MethodNotFound
from bastion.policy.decide import visible_tools
from bastion.policy.snapshot import Snapshot
from bastion.session.state import TransportSession
from bastion.upstream.fleet import UpstreamFleet
from bastion.versions import MODERN_VERSIONS

__all__ = ["SERVER_CAPABILITIES", "SERVER_INFO", "MethodRouter", "for_sessionless_wire"]

SERVER_INFO = {"name": "bastion", "version": __version__}
SERVER_CAPABILITIES: dict[str, Any] = {"tools": {"listChanged": True}, "logging": {}}
_NOT_YET = ("resources/", "prompts/", "completion/")
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


class MethodRouter:
    """Maps a JSON-RPC method to the code that answers it."""

    def __init__(
        self,
        fleet: UpstreamFleet,
        call_path: ToolCallPath,
        snapshot: Callable[[], Snapshot],
        *,
        on_surface: Callable[[TransportSession, frozenset[str]], None] | None = None,
    ) -> None:
        self._on_surface = on_surface
        self._snapshot = snapshot
        self._fleet = fleet
        self._call_path = call_path
        self._handlers: dict[str, Handler] = {
            "ping": self._ping,
            "server/discover": self._discover,
            "tools/list": self._tools_list,
            "tools/call": self._call_path.call_tool,
            "logging/setLevel": self._set_level,
        }

    async def dispatch(self, caller: Caller, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Answer one request.

        Raises:
            MethodNotFound: the method is not served.
            BastionError: whatever the handler refuses with.
        """
        handler = self._handlers.get(method)
        if handler is None:
            if method.startswith(_NOT_YET):
                raise MethodNotFound(
                    f"Method not found: {method} is not served by this gateway yet", method=method
                )
            raise MethodNotFound(f"Method not found: {method}", method=method)
        return await handler(caller, params)

    async def _ping(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def _discover(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "supportedVersions": list(MODERN_VERSIONS),
            "capabilities": SERVER_CAPABILITIES,
            "instructions": "Bastion gateway: tools are named <namespace>__<tool>.",
            "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
        }

    async def _tools_list(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        # One page: the surface is the gateway's own merged catalog, already in memory,
        # narrowed to the tools this principal's grants cover in the snapshot in force.
        visible = visible_tools(self._snapshot(), caller.principal, self._fleet.catalog.values())
        if caller.transport_session is not None:
            surface = frozenset(entry.namespace for entry in visible)
            caller.transport_session.surface_namespaces = surface
            if self._on_surface is not None:
                self._on_surface(caller.transport_session, surface)
        return {"tools": [dict(entry.definition) for entry in visible]}

    async def _set_level(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        level = params.get("level")
        if level not in _LOG_LEVELS:
            raise InvalidParams("Invalid params: logging/setLevel needs a valid level")
        if caller.transport_session is not None:
            caller.transport_session.log_level = level
        return {}
