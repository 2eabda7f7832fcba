"""The gateway's list pages: the cursor (issue 9) and the page's server metadata (issue 24).

The cursor is opaque to clients: base64url of ``[server, upstream cursor or null]``. A cursor
the gateway did not make (or that names a server no longer configured) is ``InvalidParams``,
as the spec asks for an invalid cursor. It grants nothing: every page is filtered again.

A page's ``_meta`` is the upstream's, kept where it can be attributed and tells nothing hidden:
the gateway page is drawn from exactly one upstream page, none of whose items the caller's
grants hid. The protocol's own keys (``io.modelcontextprotocol/``, such as the 2026 wire's
``serverInfo``) and the gateway's own (``io.bastion/``) are never relayed: on this side the
gateway is the server.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Sequence
from typing import Any

from bastion.errors import InvalidParams

__all__ = ["decode_cursor", "encode_cursor", "server_meta", "with_page_meta"]

# The protocol's keys, and the gateway's own (a receipt an upstream wrote would be forged).
_NOT_RELAYED_META_PREFIXES = ("io.modelcontextprotocol/", "io.bastion/")


def encode_cursor(server: str, upstream_cursor: str | None) -> str:
    raw = json.dumps([server, upstream_cursor], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: object, servers: Collection[str]) -> tuple[str, str | None]:
    """``(server, upstream cursor)`` from a client's cursor.

    Raises:
        InvalidParams: not a cursor this gateway made for one of ``servers``.
    """
    try:
        if not isinstance(cursor, str):
            raise ValueError("not a string")
        decoded = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidParams("Invalid params: unknown cursor") from None
    if (
        not isinstance(decoded, list)
        or len(decoded) != 2
        or decoded[0] not in servers
        or not (decoded[1] is None or isinstance(decoded[1], str))
    ):
        raise InvalidParams("Invalid params: unknown cursor")
    return decoded[0], decoded[1]


def server_meta(result: dict[str, Any]) -> dict[str, Any]:
    """The server's own ``_meta`` keys of one upstream list result (empty when it has none)."""
    meta = result.get("_meta")
    if not isinstance(meta, dict):
        return {}
    return {k: v for k, v in meta.items() if not k.startswith(_NOT_RELAYED_META_PREFIXES)}


def with_page_meta(page: dict[str, Any], drawn: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """``page`` with the ``_meta`` of the one upstream page it was drawn from (``None``: not keepable)."""
    if len(drawn) == 1 and drawn[0]:
        return {**page, "_meta": drawn[0]}
    return page
