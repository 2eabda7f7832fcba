"""The one tool surface: exposed names, never shadowed (issue 12 point 8, issue 9 point 3).

Owns: naming an upstream tool for clients (``<namespace><separator><tool>``, or the tool's
own name for a transparent server) and merging every server's tools into one catalog in
which each exposed name routes to exactly one server. Two servers may offer the same
exposed name: namespaces ``notes`` and ``notes_`` both make ``notes___x``; a transparent
server's ``a__b`` meets namespace ``a``'s ``b``. A name some server already holds stays
with it; the newcomer's tool is left out and reported as a collision (``/readyz``), never
silently routed elsewhere. At start, any collision refuses the gateway.
Pure functions: no I/O, no locks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bastion.upstream.era_paths import param_header_map

__all__ = ["Collision", "ToolEntry", "all_collisions", "exposed_name", "merge_catalog"]


@dataclass(frozen=True)
class ToolEntry:
    """One tool of the surface: where it routes, and how it is shown."""

    exposed_name: str
    server: str
    namespace: str
    upstream_name: str
    definition: Mapping[str, Any]
    # Issue 27: the digest of the upstream's changed definition this entry stands in for, shown
    # with its pinned definition and refused at call (pinning/book.py); None when it is the pin.
    withheld: str | None = None

    @property
    def read_only(self) -> bool:
        annotations = self.definition.get("annotations")
        return isinstance(annotations, dict) and annotations.get("readOnlyHint") is True

    @functools.cached_property
    def declares_param_headers(self) -> bool:
        """Whether the tool's schema has valid ``x-mcp-header`` parameters (walked once, not per call)."""
        return bool(param_header_map(self.definition.get("inputSchema")))


@dataclass(frozen=True)
class Collision:
    """``refused`` offered ``name``, which ``holder`` already exposes: ``refused``'s tool is left out."""

    name: str
    holder: str
    refused: str

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "holder": self.holder, "refused": self.refused}


def exposed_name(namespace: str, separator: str, tool: str, *, transparent: bool) -> str:
    """The name clients see for ``tool`` of a server with this namespace."""
    return tool if transparent else f"{namespace}{separator}{tool}"


def merge_catalog(
    tools_by_server: Mapping[str, Sequence[ToolEntry]], previous: Mapping[str, ToolEntry]
) -> tuple[dict[str, ToolEntry], list[Collision]]:
    """Merge every server's tools; a name keeps the server that held it in ``previous``.

    Servers are taken in the order of ``tools_by_server`` (the configuration's) for names
    nobody held before. Every refused tool is one :class:`Collision`.
    """
    merged: dict[str, ToolEntry] = {}
    # (1) Incumbents first: a list_changed elsewhere never takes a name away from its holder.
    for server, entries in tools_by_server.items():
        for entry in entries:
            held = previous.get(entry.exposed_name)
            if held is not None and held.server == server:
                merged[entry.exposed_name] = entry
    # (2) Then every other tool, refused where another server holds its name.
    collisions: list[Collision] = []
    for server, entries in tools_by_server.items():
        for entry in entries:
            holder = merged.get(entry.exposed_name)
            if holder is None:
                merged[entry.exposed_name] = entry
            elif holder.server != server:
                collisions.append(Collision(entry.exposed_name, holder.server, server))
    return merged, collisions


def all_collisions(tools_by_server: Mapping[str, Sequence[ToolEntry]]) -> list[Collision]:
    """Every name two servers both offer, whoever came first (the start-time check)."""
    return merge_catalog(tools_by_server, {})[1]
