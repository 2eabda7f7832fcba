"""The gateway's list cursor: which upstream to ask next, and that upstream's own cursor (issue 9).

Opaque to clients: base64url of ``[server, upstream cursor or null]``. A cursor the
gateway did not make (or that names a server no longer configured) is ``InvalidParams``,
as the spec asks for an invalid cursor. It grants nothing: every page is filtered again.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection

from bastion.errors import InvalidParams

__all__ = ["decode_cursor", "encode_cursor"]


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
