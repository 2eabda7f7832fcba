"""What an upstream is told of the client behind one request (``CallContext``), made in one place.

``call.py`` (a ``tools/call``) and ``tasks/relay.py`` (the ``tasks/*`` requests that continue a
task, issue 24) send on the same client's own upstream session or process: one function builds
the context both give the upstream, so a task is polled where it was created.
"""

from __future__ import annotations

from typing import Any

from mcp_types import LOG_LEVEL_META_KEY

from bastion.caller import Caller
from bastion.policy.snapshot import Snapshot
from bastion.upstream.base import CallContext

__all__ = ["call_context", "progress_token", "requested_log_level"]


def call_context(caller: Caller, snapshot: Snapshot, server: str, params: dict[str, Any]) -> CallContext:
    """The context of ``caller``'s request to ``server``: its own upstream session or process."""
    transport_session = caller.transport_session
    return CallContext(
        relay=caller.relay,
        client_capabilities=caller.client_capabilities,
        progress_token=progress_token(params),
        upstream_sessions=transport_session.upstream_sessions if transport_session else None,
        timeout_s=snapshot.servers[server].timeout_s or snapshot.gateway.upstream_timeout_s,
        log_level=caller.log_level or requested_log_level(params),
        client_answers_requests=transport_session is not None,
        owner=caller.agent,
        owner_ref=caller.owner_ref,
        agent_session_id=caller.principal.agent_session_id,
    )


def requested_log_level(params: dict[str, Any]) -> str | None:
    """A 2026-07-28 client asks for log messages per request, in _meta (there is no logging/setLevel)."""
    meta = params.get("_meta")
    level = meta.get(LOG_LEVEL_META_KEY) if isinstance(meta, dict) else None
    return level if isinstance(level, str) else None


def progress_token(params: dict[str, Any]) -> str | int | None:
    meta = params.get("_meta")
    if isinstance(meta, dict):
        token = meta.get("progressToken")
        if isinstance(token, str | int) and not isinstance(token, bool):
            return token
    return None
