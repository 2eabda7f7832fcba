"""A refused start-up said in one line (issue #11 point 7).

A gateway that cannot start (its generation held by a live worker, a store
file that cannot be opened or is locked, a data directory it may not write)
is refused with its reason, never a traceback. The lifespan records the line
(:func:`start_refusal_line`); :class:`StartRefusal`, a plain ASGI middleware,
puts that line in place of the traceback Starlette would hand the server in
``lifespan.startup.failed``; ``bastion serve`` prints it and exits non-zero.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bastion.errors import BastionError

__all__ = ["StartRefusal", "start_refusal_line"]


def start_refusal_line(exc: BaseException) -> str:
    """One line: the reason and what to look at; no secrets, no traceback."""
    if isinstance(exc, BastionError):
        detail = exc.data.get("detail")
        text = f"{exc.reason.value}: {exc.message}" + (f" ({detail})" if detail else "")
        if exc.cause:  # a named cause (issue #23: "authentication refused by PostgreSQL"), no secret
            text += f": {exc.cause}"
    elif isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        text = f"{type(exc).__name__}:{where} {exc.strerror or exc}"
    else:  # pragma: no cover - the lifespan records only the two kinds above
        text = type(exc).__name__
    return "start refused: " + " ".join(text.split())


class StartRefusal:
    """Replace the traceback of a refused start with its one line (lifespan scope only)."""

    def __init__(self, app: ASGIApp, refusal: Callable[[], str | None]) -> None:
        self.app = app
        self._refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_one_line(message: Message) -> None:
            line = self._refusal()
            if message["type"] == "lifespan.startup.failed" and line is not None:
                message = {**message, "message": line}
            await send(message)

        await self.app(scope, receive, send_one_line)
