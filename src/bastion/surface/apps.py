"""MCP Apps (``io.modelcontextprotocol/ui``) through the gateway: a tool's UI names a resource the
client can read here (issue 24).

A UI-bound tool's ``_meta.ui.resourceUri`` names a ``ui://`` resource of its upstream. Clients see
that resource under its exposed URI (``surface/uris.py``), so the tool they are shown names the
exposed URI too, and the host's ``resources/read`` of it is decided under the caller's resource
grants like any other. A URI that cannot be shown without ambiguity leaves the ``ui`` entry out
(the tool still works as a plain tool, as SEP-2133 asks of every extension). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.surface.uris import expose_uri

__all__ = ["exposed_tool"]


def exposed_tool(definition: Mapping[str, Any], namespace: str, *, transparent: bool) -> dict[str, Any]:
    """The tool definition clients see: ``definition``, its UI resource named as they can read it."""
    tool = dict(definition)
    meta = tool.get("_meta")
    ui = meta.get("ui") if isinstance(meta, dict) else None
    if not isinstance(ui, dict) or "resourceUri" not in ui:
        return tool
    assert isinstance(meta, dict)
    uri = ui["resourceUri"]
    exposed = expose_uri(namespace, uri, transparent=transparent) if isinstance(uri, str) else None
    if exposed is None:
        tool["_meta"] = {k: v for k, v in meta.items() if k != "ui"}
    else:
        tool["_meta"] = {**meta, "ui": {**ui, "resourceUri": exposed}}
    return tool
