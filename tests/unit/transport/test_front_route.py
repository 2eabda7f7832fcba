"""McpFirst: /mcp goes straight to the front door; everything else keeps the Starlette stack."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bastion.front_route import MCP_PATH, McpFirst

pytestmark = pytest.mark.anyio


class _Front:
    """A stand-in front door that records the scopes it is handed."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-served-by", b"front")]})
        await send({"type": "http.response.body", "body": b"front"})


async def _routed(request: Request) -> Response:
    return PlainTextResponse("starlette:" + request.url.path)


def _app(front: _Front | None) -> McpFirst:
    routes = [Route(MCP_PATH, _routed, methods=["GET", "POST"]), Route("/healthz", _routed, methods=["POST"])]
    return McpFirst(lambda: front, routes=routes)


async def _get(app: McpFirst, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        with anyio.fail_after(10):
            return await client.post(path, **kwargs)


async def test_mcp_goes_to_the_front_door_without_the_starlette_stack() -> None:
    """A POST to /mcp reaches the front door with the server's scope, untouched by Starlette's router."""
    front = _Front()
    response = await _get(_app(front), "/mcp", content=b"{}")
    assert response.headers["x-served-by"] == "front"
    assert len(front.scopes) == 1
    assert "router" not in front.scopes[0] and "endpoint" not in front.scopes[0]


async def test_other_paths_and_a_missing_front_door_take_the_starlette_path() -> None:
    """Other paths, /mcp/ with a slash, and /mcp before the front door exists are Starlette's to serve."""
    front = _Front()
    app = _app(front)
    assert (await _get(app, "/healthz")).text == "starlette:/healthz"
    assert (await _get(app, "/mcp/", follow_redirects=False)).status_code in (307, 405)
    assert front.scopes == []
    assert (await _get(_app(None), "/mcp")).text == "starlette:/mcp"
