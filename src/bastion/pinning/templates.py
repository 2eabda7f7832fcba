"""Resource templates against their pins (issue 27).

``resources/templates/list`` is relayed page by page, not kept as a catalog, so
each page's templates are admitted here as they pass (``pinning/book.py``),
keyed by the template's ``name``: a changed template is listed with its pinned
definition (``withhold``) or left out (``hide``); a template with no name
cannot be pinned and is left out while the server is pinned. Templates only
describe URIs: reads are decided per URI (``surface/resources.py``), so a
withheld template refuses no read.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from bastion.pinning.book import PinBook
from bastion.pinning.modes import PinMode
from bastion.store.pins import PinKind
from bastion.upstream.catalog import ToolEntry

__all__ = ["admit_templates"]


async def admit_templates(
    book: PinBook | None, server: str, namespace: str, items: Sequence[Any]
) -> list[Any]:
    """The templates of one upstream page that may be listed, as the upstream named them."""
    if book is None or book.mode_of(server) is PinMode.OFF:
        return list(items)
    entries = [
        ToolEntry(item["name"], server, namespace, item["name"], MappingProxyType(item))
        for item in items
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]
    admitted = await book.admit(server, PinKind.RESOURCE_TEMPLATE, entries)
    return [dict(entry.definition) for entry in admitted]
