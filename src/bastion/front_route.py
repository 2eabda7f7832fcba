"""``/mcp`` as plain ASGI, ahead of Starlette (issue #13, "Lean I/O").

Every MCP request used to pass Starlette's whole stack (the start-refusal
middleware, ``ServerErrorMiddleware``, ``ExceptionMiddleware``, the router's
match over every route) before reaching the front door, which needs none of
it: it reads the raw scope, renders its own typed errors and sets its own
headers (CORS included). :class:`McpFirst` hands an HTTP request for exactly
``/mcp`` straight to the front door once the gateway has started; everything
else (the lifespan, the admin API, health, metrics, evidence reads, ``/mcp``
before start-up or under a ``root_path``) takes the Starlette path unchanged.

An exception escaping the front door (a bug) still ends as a 500 from the
server, which logs it, as ``ServerErrorMiddleware`` did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["MCP_PATH", "McpFirst"]

MCP_PATH = "/mcp"


class McpFirst(Starlette):
    """A Starlette app whose ``/mcp`` HTTP requests skip the middleware stack and the router."""

    def __init__(self, front: Callable[[], ASGIApp | None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._front = front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == MCP_PATH and not scope.get("root_path"):
            front = self._front()
            if front is not None:
                await front(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
