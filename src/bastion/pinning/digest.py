"""What of a definition is pinned, and its digest: SHA-256 of the RFC 8785 form (issue 27).

The pinned form of a tool, prompt or resource template is the fields a model
or a client reads to decide what it does (name, title, description, schemas,
arguments, annotations), with the upstream's own name: the namespace prefix
is the gateway's, not the upstream's. An upstream's definition is hostile
text: one whose canonical form passes :data:`MAX_DEFINITION_BYTES`, or that
RFC 8785 cannot canonicalize, is never pinned nor exposed
(:class:`DefinitionUnpinnable`). No I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from bastion.crypto.jcs import CanonicalizationError, canonical_json
from bastion.store.pins import PinKind

__all__ = [
    "MAX_DEFINITION_BYTES",
    "PINNED_FIELDS",
    "DefinitionUnpinnable",
    "definition_digest",
    "pinned_form",
]

#: The largest canonical definition pinned (and stored twice, pin and offer, per name).
MAX_DEFINITION_BYTES = 64 * 1024

PINNED_FIELDS: Mapping[PinKind, tuple[str, ...]] = {
    PinKind.TOOL: ("name", "title", "description", "inputSchema", "outputSchema", "annotations"),
    PinKind.PROMPT: ("name", "title", "description", "arguments"),
    PinKind.RESOURCE_TEMPLATE: ("name", "title", "description", "uriTemplate", "mimeType", "annotations"),
}


class DefinitionUnpinnable(ValueError):
    """A definition too large to pin, or with no RFC 8785 form: it is left out."""


def pinned_form(kind: PinKind, definition: Mapping[str, Any], upstream_name: str) -> dict[str, Any]:
    """The pinned fields of ``definition`` present in it, named with the upstream's ``upstream_name``."""
    form = {field: definition[field] for field in PINNED_FIELDS[kind] if field in definition}
    form["name"] = upstream_name
    return form


def definition_digest(form: Mapping[str, Any]) -> str:
    """The hex SHA-256 of ``form``'s RFC 8785 bytes. Raises :class:`DefinitionUnpinnable`."""
    try:
        canonical = canonical_json(form)
    except (CanonicalizationError, TypeError, ValueError) as exc:
        raise DefinitionUnpinnable(f"no RFC 8785 form: {type(exc).__name__}") from None
    if len(canonical) > MAX_DEFINITION_BYTES:
        raise DefinitionUnpinnable(f"{len(canonical)} bytes, more than {MAX_DEFINITION_BYTES}")
    return hashlib.sha256(canonical).hexdigest()
