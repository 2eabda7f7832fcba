"""CORS at the front door, for browser clients of an allowed ``Origin`` (issue 12 point 14).

``transport/rebinding.py`` decides whether an ``Origin`` is allowed; this
module only writes the headers once it is:

- a preflight (``OPTIONS`` with an ``Origin``) is answered 204 with the
  methods and request headers MCP uses, ``Mcp-Param-*`` headers echoed as the
  browser listed them (there is no wildcard for a prefix);
- every other answer to an allowed ``Origin`` names that origin exactly and
  exposes ``Mcp-Session-Id``.

A refused ``Origin`` never gets here, so its answer carries no CORS headers.
"""

from __future__ import annotations

from starlette.types import Message, Send

__all__ = ["CorsSend", "preflight"]

ALLOWED_METHODS = "GET, POST, DELETE"
ALLOWED_HEADERS = (
    "authorization",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "mcp-method",
    "mcp-name",
)
EXPOSED_HEADERS = "Mcp-Session-Id"
MAX_AGE_S = 600
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~")


def _answer_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", EXPOSED_HEADERS.encode()),
        (b"vary", b"Origin"),
    ]


def _requested_param_headers(requested: str | None) -> list[str]:
    """The ``Mcp-Param-*`` names a preflight asked for, kept only when they are plain header tokens."""
    names = [name.strip().lower() for name in (requested or "").split(",")]
    return [
        name
        for name in names
        if name.startswith("mcp-param-") and len(name) <= 128 and set(name) <= _TOKEN_CHARS
    ]


async def preflight(send: Send, origin: str, requested_headers: str | None) -> None:
    """Answer a CORS preflight from an ``Origin`` already found allowed."""
    allowed = ", ".join([*ALLOWED_HEADERS, *_requested_param_headers(requested_headers)])
    headers = [
        *_answer_headers(origin),
        (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
        (b"access-control-allow-headers", allowed.encode()),
        (b"access-control-max-age", str(MAX_AGE_S).encode()),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


class CorsSend:
    """An ASGI ``send`` that adds the CORS answer headers once :meth:`allow` named the origin."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._origin: str | None = None

    def allow(self, origin: str | None) -> None:
        """Name the request's allowed ``Origin`` (``None``: no ``Origin``, no CORS headers)."""
        self._origin = origin

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self._origin is not None:
            message = {**message, "headers": [*message.get("headers", []), *_answer_headers(self._origin)]}
        await self._send(message)
