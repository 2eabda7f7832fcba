"""The MCP protocol revisions Bastion speaks, in both eras (DESIGN section 0).

Taken from the official SDK's registry so the two never disagree.
"""

from __future__ import annotations

from typing import Final

from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    PROTOCOL_VERSION_META_KEY,
)

__all__ = [
    "CAPABILITIES_META_KEY",
    "CLIENT_INFO_META_KEY",
    "DEFAULT_HANDSHAKE_VERSION",
    "HANDSHAKE_VERSIONS",
    "LATEST_HANDSHAKE_VERSION",
    "MODERN_VERSION",
    "MODERN_VERSIONS",
    "PROTOCOL_VERSION_META_KEY",
    "SUPPORTED_VERSIONS",
    "TASKS_VERSIONS",
]

# Session era: initialize + Mcp-Session-Id.
HANDSHAKE_VERSIONS: Final[tuple[str, ...]] = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE_VERSION: Final[str] = HANDSHAKE_VERSIONS[-1]
# A session-era request without MCP-Protocol-Version is taken as this revision (spec: "assume 2025-03-26").
DEFAULT_HANDSHAKE_VERSION: Final[str] = "2025-03-26"
# Session-era revisions that have 2025-11-25 tasks (the ``tasks`` capability, ``tasks/*``,
# ``params.task``); at the others a client is served as if no upstream had tasks (issue 24).
TASKS_VERSIONS: Final[frozenset[str]] = frozenset({"2025-11-25"})
# Sessionless era: server/discover, per-request envelope.
MODERN_VERSIONS: Final[tuple[str, ...]] = ("2026-07-28",)
MODERN_VERSION: Final[str] = MODERN_VERSIONS[-1]
# The one list a client is told: ``server/discover``'s ``supportedVersions`` and the ``supported``
# of every UnsupportedProtocolVersion error (-32022). Both name the per-request revisions only, as
# the reference servers do: session-era revisions are negotiated by ``initialize``, not announced.
SUPPORTED_VERSIONS: Final[tuple[str, ...]] = MODERN_VERSIONS

CAPABILITIES_META_KEY: Final[str] = CLIENT_CAPABILITIES_META_KEY
