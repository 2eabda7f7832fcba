"""Which path a request takes to an upstream, and what it carries across eras (DESIGN section 0).

Small pure rules shared by the upstream transports, so each pairing of client
era and upstream era reads in one place (issue #8):

- a session-era client on an upstream that speaks both eras takes the session
  path (its own upstream session): nothing of its era is lost;
- the client's log level crosses into the sessionless era as the
  ``io.modelcontextprotocol/logLevel`` ``_meta`` key;
- ``x-mcp-header`` parameters of a tool become its ``Mcp-Param-*`` headers.

Never performs I/O.
"""

from __future__ import annotations

from typing import Any, Final

from mcp.shared.inbound import find_invalid_x_mcp_header, x_mcp_header_map
from mcp_types import LOG_LEVEL_META_KEY

from bastion.upstream.base import CallContext

__all__ = [
    "LIST_CHANGED_FILTER",
    "LOG_LEVELS",
    "param_header_map",
    "wants_session_path",
    "with_log_level",
]

LOG_LEVELS: Final[tuple[str, ...]] = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
# What Bastion listens for on a sessionless upstream's subscriptions/listen stream.
LIST_CHANGED_FILTER: Final[dict[str, bool]] = {
    "toolsListChanged": True,
    "promptsListChanged": True,  # issue 9
    "resourcesListChanged": True,
}


def wants_session_path(speaks_session: bool, ctx: CallContext) -> bool:
    """True when a sessionless upstream that also speaks the session era should get this request that way."""
    return speaks_session and ctx.upstream_sessions is not None


def with_log_level(meta: dict[str, Any], ctx: CallContext | None) -> dict[str, Any]:
    """``meta`` carrying the client's log level, as the 2026-07-28 wire asks for it per request.

    A session-era client that never set a level hears every level from a
    session-era server; on the sessionless wire silence is the default, so
    such a client asks for everything (``debug``) to keep what it had.
    """
    if ctx is None:
        return meta
    level = ctx.log_level or ("debug" if ctx.client_answers_requests else None)
    if level in LOG_LEVELS:
        return {**meta, LOG_LEVEL_META_KEY: level}
    return meta


def param_header_map(input_schema: Any) -> dict[tuple[str, ...], str]:
    """The tool's ``x-mcp-header`` parameters (argument path → header token); empty when none or invalid."""
    if not isinstance(input_schema, dict) or find_invalid_x_mcp_header(input_schema) is not None:
        return {}
    return x_mcp_header_map(input_schema)
