"""Headers that decide something come once (issue #22 point 5).

``Host`` and ``Origin`` decide who may talk to the gateway (``rebinding.py``);
``Mcp-Method`` and ``Mcp-Name`` are compared with the body, so an intermediary may
route by them; the protocol version, the session id and the credential pick the
era, the session and the principal. A request that names one of them twice is
ambiguous: a reader that takes the first and one that takes the last disagree, and
an intermediary can be steered past. Refused before anything else reads them, from
the ASGI scope's raw header list (duplicate ``Mcp-Param-*`` headers are refused with
the call's arguments, ``param_headers.py``). This module raises; ``transport/``
renders.
"""

from __future__ import annotations

from typing import Final

from starlette.types import Scope

from bastion.errors import DuplicateHeader

__all__ = ["SINGLE_HEADERS", "check_single_headers"]

SINGLE_HEADERS: Final[frozenset[bytes]] = frozenset(
    {
        b"host",
        b"origin",
        b"mcp-method",
        b"mcp-name",
        b"mcp-protocol-version",
        b"mcp-session-id",
        b"authorization",
    }
)


def check_single_headers(scope: Scope) -> None:
    """Refuse a request that carries one of :data:`SINGLE_HEADERS` more than once.

    Raises:
        DuplicateHeader: HTTP 400, naming the header (never its values).
    """
    seen: set[bytes] = set()
    for raw_name, _ in scope.get("headers") or ():
        name = raw_name.lower()
        if name not in SINGLE_HEADERS:
            continue
        if name in seen:
            raise DuplicateHeader(header=name.decode("latin-1"))
        seen.add(name)
