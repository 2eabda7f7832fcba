"""``resources/list``, ``resources/templates/list`` and ``resources/read`` through the gateway (issue 9).

Steps 1 to 3 of DESIGN section 2 (transport, authentication, agent session) happened
before this module: the :class:`~bastion.caller.Caller` is their product. Here:
(4) the grant decision against the one snapshot in force (resource patterns match the
upstream URI read, or the upstream URI template listed), lists filtered to what the
caller may use; (7) the request sent on the caller's own upstream session; (8) the
read's audit entry (decision, digests), then the answer. A resource the caller may not
see is answered exactly like one nobody serves (``UnknownResource``); the audit keeps
the truth. Lists walk the upstreams in configuration order; a page ends where an
upstream's own page ends with a cursor (``pages.py``), so upstreams that do not
paginate make one page. URIs are mapped by ``uris.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from bastion.admission.rounds import RoundStates
from bastion.call import strip_reserved_meta
from bastion.caller import Caller
from bastion.errors import InvalidParams, UpstreamError
from bastion.pinning.templates import admit_templates
from bastion.policy.decide import SurfaceKind, surface_visible
from bastion.policy.snapshot import Snapshot
from bastion.surface.limits import SurfaceLimits
from bastion.surface.pages import decode_cursor, encode_cursor, server_meta, with_page_meta
from bastion.surface.relay import AccessRecord, decide_resource, send_in_rounds, upstream_context
from bastion.surface.uris import expose_uri
from bastion.upstream.base import UpstreamReplied
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["ResourcePath"]

logger = logging.getLogger(__name__)

# (method, result key, the field of each item that holds its URI or template)
_LISTS = {
    "resources/list": ("resources", "uri"),
    "resources/templates/list": ("resourceTemplates", "uriTemplate"),
}


class ResourcePath:
    """Lists and reads resources for one caller against the snapshot in force."""

    def __init__(
        self,
        fleet: UpstreamFleet,
        snapshot: Callable[[], Snapshot],
        limits: SurfaceLimits | None = None,
        rounds: RoundStates | None = None,
    ) -> None:
        self._fleet = fleet
        self._snapshot = snapshot
        self._limits = limits
        self._rounds = rounds if rounds is not None else RoundStates()

    def servers(self) -> list[str]:
        """The servers that offer resources, in configuration order."""
        return [name for name in self._fleet.upstreams if self._fleet.offers(name, "resources")]

    async def list_resources(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        return await self._list(caller, params, "resources/list")

    async def list_templates(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        return await self._list(caller, params, "resources/templates/list")

    async def _list(self, caller: Caller, params: dict[str, Any], method: str) -> dict[str, Any]:
        """One page of the merged list. Raises ``InvalidParams`` for a cursor this gateway did not make."""
        snapshot = self._snapshot()
        key, uri_field = _LISTS[method]
        servers = self.servers()
        start, upstream_cursor = (servers[0] if servers else "", None)
        if params.get("cursor") is not None:
            start, upstream_cursor = decode_cursor(params["cursor"], servers)
        items: list[dict[str, Any]] = []
        drawn: list[dict[str, Any] | None] = []  # per upstream page drawn: its _meta, if it may be kept
        for server in servers[servers.index(start) :] if servers else []:
            upstream = self._fleet.upstreams[server]
            request = {"cursor": upstream_cursor} if upstream_cursor else {}
            upstream_cursor = None
            try:
                result = await upstream.call(method, request, upstream_context(caller, snapshot, server))
            except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
                # One upstream down leaves its part out of the list; the others still answer.
                logger.warning("%s of upstream %s failed: %s", method, server, exc)
                continue
            transparent = self._fleet.is_transparent(server)
            hidden = False
            listed = result.get(key) or []
            if method == "resources/templates/list":  # issue 27: templates are pinned as they pass
                listed = await admit_templates(self._fleet.pins, server, upstream.namespace, listed)
            for item in listed:
                original = item.get(uri_field) if isinstance(item, dict) else None
                if not isinstance(original, str):
                    hidden = True
                    continue
                exposed = expose_uri(upstream.namespace, original, transparent=transparent)
                # (4) Only what this caller's grants cover is listed.
                if exposed is None or not surface_visible(
                    snapshot, caller.principal, SurfaceKind.RESOURCE, server, upstream.namespace, original
                ):
                    hidden = True
                    continue
                items.append({**item, uri_field: exposed})
            drawn.append(None if hidden else server_meta(result))
            next_cursor = result.get("nextCursor")
            if isinstance(next_cursor, str) and next_cursor:
                return with_page_meta({key: items, "nextCursor": encode_cursor(server, next_cursor)}, drawn)
        return with_page_meta({key: items}, drawn)

    async def read(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """Read one resource.

        Raises:
            InvalidParams: no string ``uri``.
            UnknownResource: no server the caller may see serves this URI (audited).
            UpstreamReplied: the upstream answered with an error (relayed verbatim).
            UpstreamError: the upstream failed.
        """
        snapshot = self._snapshot()
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise InvalidParams("Invalid params: resources/read needs a string uri")
        record = AccessRecord(caller, "resources/read", params, snapshot)
        # (4) Grant decision: hidden is answered as unknown; the audit keeps grant_denied.
        server, target = await decide_resource(self._fleet, snapshot, caller, uri, record, self._limits)
        upstream = self._fleet.upstreams[server]
        # (7) Invoke on the caller's own upstream session; (8) the entry, then the answer, whose
        #     contents name their URIs as the caller knows them.
        request = {**strip_reserved_meta(params), "uri": target.uri}
        result = await send_in_rounds(
            record,
            self._rounds,
            server,
            target.uri,
            {},
            upstream,
            request,
            upstream_context(caller, snapshot, server),
        )
        transparent = self._fleet.is_transparent(server)
        contents = [
            {**c, "uri": expose_uri(upstream.namespace, c["uri"], transparent=transparent) or uri}
            if isinstance(c, dict) and isinstance(c.get("uri"), str)
            else c
            for c in result.get("contents") or []
        ]
        return {**result, "contents": contents}
