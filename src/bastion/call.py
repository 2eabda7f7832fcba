"""One ``tools/call``, step by step as DESIGN section 2 numbers them.

Steps 1 (transport) and 2 (authentication) happened before this module is
reached: the :class:`~bastion.caller.Caller` is their product. This module
owns steps 3 to 8 and is the one place to read the life of a tool call.
Every refusal is raised as a typed error; ``transport/`` renders it.

Steps not yet built are named here, with the issue that builds them, so the
order of checks cannot drift when they arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bastion.caller import Caller
from bastion.errors import InvalidParams, UnknownTool
from bastion.policy.snapshot import Snapshot
from bastion.upstream.base import CallContext
from bastion.upstream.fleet import ToolEntry, UpstreamFleet

__all__ = ["ToolCallPath", "strip_reserved_meta"]

_RESERVED_META_PREFIX = "io.modelcontextprotocol/"


def strip_reserved_meta(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` without the client's protocol envelope keys (the upstream gets the gateway's own)."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        return params
    kept = {k: v for k, v in meta.items() if not k.startswith(_RESERVED_META_PREFIX)}
    out = {k: v for k, v in params.items() if k != "_meta"}
    if kept:
        out["_meta"] = kept
    return out


class ToolCallPath:
    """Runs one tools/call for one caller against the snapshot in force."""

    def __init__(self, fleet: UpstreamFleet, snapshot: Callable[[], Snapshot]) -> None:
        self._fleet = fleet
        self._snapshot = snapshot

    async def call_tool(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """Route, decide and relay one tool call; returns the upstream's result.

        Raises:
            InvalidParams: ``name`` missing or not a string, ``arguments`` not an object.
            UnknownTool: no tool of the surface has that name.
            UpstreamError: the upstream failed (see ``upstream/base.py``).
            UpstreamReplied: the upstream answered with a JSON-RPC error.
        """
        snapshot = self._snapshot()  # one snapshot decides the whole call
        name = params.get("name")
        arguments = params.get("arguments", {})
        if not isinstance(name, str):
            raise InvalidParams("Invalid params: tools/call needs a string name")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise InvalidParams("Invalid params: tools/call arguments must be an object")

        # (3) Agent session check: static configured agents neither expire nor get revoked;
        #     agent sessions with expiry and revocation arrive with issue #4.
        # (4) Grant decision: resolve the tool in the surface. Per-agent grants arrive with issue #4;
        #     until then every configured agent may call every exposed tool.
        entry = self._fleet.lookup(name)
        if entry is None:
            raise UnknownTool(f"Unknown tool: {name}", tool=name)
        # (5) Attachment gate for mutating tools: issue #5.
        # (6) Execution admission (params._cmcp): issue #3.
        # (7) Invoke on this client's own upstream session.
        upstream_params = self._upstream_params(entry, params, arguments)
        ctx = CallContext(
            relay=caller.relay,
            client_capabilities=caller.client_capabilities,
            progress_token=_progress_token(params),
            upstream_sessions=caller.transport_session.upstream_sessions
            if caller.transport_session
            else None,
            timeout_s=snapshot.servers[entry.server].timeout_s or snapshot.gateway.upstream_timeout_s,
            log_level=caller.log_level,
            client_answers_requests=caller.transport_session is not None,
        )
        result = await self._fleet.upstreams[entry.server].call("tools/call", upstream_params, ctx)
        # (8) Outcome: the durable terminal record and the audit entry arrive with issue #3.
        return result

    @staticmethod
    def _upstream_params(
        entry: ToolEntry, params: dict[str, Any], arguments: dict[str, Any]
    ) -> dict[str, Any]:
        out = strip_reserved_meta(
            {k: v for k, v in params.items() if k not in ("name", "arguments", "_cmcp")}
        )
        out["name"] = entry.upstream_name
        out["arguments"] = arguments
        return out


def _progress_token(params: dict[str, Any]) -> str | int | None:
    meta = params.get("_meta")
    if isinstance(meta, dict):
        token = meta.get("progressToken")
        if isinstance(token, str | int) and not isinstance(token, bool):
            return token
    return None
