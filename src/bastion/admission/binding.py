"""The immutable binding of an execution (DESIGN section 3, seed 000).

``binding = SHA-256 hex of JCS({"server": server, "tool": tool, "arguments": arguments})``
where JCS is RFC 8785 canonical JSON, computed after namespacing is resolved:
``server`` is the upstream server's configured name and ``tool`` the tool's
name at that upstream, never the namespaced name the client saw. A request
that reuses an ``execution_id`` with another binding is a collision, not a
retry. This module is pure; it never stores or compares bindings (the store
does, atomically with the reservation).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import rfc8785

from bastion.crypto.jcs import canonical_json
from bastion.errors import InvalidParams

__all__ = ["bind_call"]


def bind_call(server: str, tool: str, arguments: Mapping[str, Any] | None) -> tuple[str, str]:
    """The lowercase SHA-256 hex binding of one resolved call, and the arguments' audit digest
    (``sha256:<hex>``), canonicalizing the arguments once.

    Absent arguments (``None``) bind as ``{}``: MCP treats the two alike. Raises
    :class:`InvalidParams` (``field="arguments"``) when the arguments have no
    canonical form (a NaN, an integer beyond the I-JSON range, a non-JSON type):
    a binding that cannot be verified admits nothing (DESIGN section 9).

    The binding document's canonical form is spelled around the arguments' own: its keys
    ``arguments``, ``server``, ``tool`` are ASCII, so RFC 8785 orders them so, and a member's
    canonical form does not depend on its neighbours (``tests/unit/admission`` holds this
    equal to ``canonical_json`` of the whole document).
    """
    try:
        args = canonical_json(dict(arguments or {}))
        spelled = (b'{"arguments":', args, b',"server":', canonical_json(server), b',"tool":')
        document = b"".join((*spelled, canonical_json(tool), b"}"))
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        # The message names the defect's kind, never the offending value.
        raise InvalidParams(
            "arguments have no canonical JSON form", field="arguments", problem=type(exc).__name__
        ) from exc
    return hashlib.sha256(document).hexdigest(), "sha256:" + hashlib.sha256(args).hexdigest()
