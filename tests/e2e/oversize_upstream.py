"""An MCP upstream that answers some tool calls with a message that never ends (issue #13 hardening).

``python -m tests.e2e.oversize_upstream http`` serves just enough of either era for a gateway
that pins it (``era = "sessionless"``, or ``"session"``: it answers ``initialize`` with a session
id) and prints ``LISTENING <url>``; ``python -m tests.e2e.oversize_upstream stdio`` speaks
JSON-RPC lines on its pipes. Tools:

- ``echo``: a small, normal answer;
- ``endless_json`` (http): an ``application/json`` body that never ends;
- ``endless_sse`` (http): an event stream whose one event's data line never ends;
- ``endless_line`` (stdio): a message line that never ends.

A gateway that read a whole message before judging its size would wait forever (and grow
without bound); one that stops at its bound answers at once.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_PADDING = b"x" * 65_536
_OK = {"content": [{"type": "text", "text": "ok"}]}


def _tools(*names: str) -> dict[str, Any]:
    return {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in names]}


def _head(request_id: Any) -> bytes:
    """The start of an answer whose text never ends."""
    return b'{"jsonrpc":"2.0","id":' + json.dumps(request_id).encode() + b',"result":{"content":[{"text":"'


async def _endless(first: bytes) -> AsyncIterator[bytes]:
    yield first
    while True:
        yield _PADDING
        await anyio.sleep(0)


async def _serve(request: Request) -> Response:
    if request.method != "POST":
        return Response(status_code=405 if request.method == "GET" else 200)  # no GET stream; DELETE ok
    message: dict[str, Any] = json.loads(await request.body())
    method, request_id = message.get("method"), message.get("id")
    headers: dict[str, str] = {}
    if request_id is None:
        return Response(status_code=202)
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "oversize", "version": "1"},
        }
        headers["mcp-session-id"] = "oversize-session"
    elif method == "tools/list":
        result = {**_tools("echo", "endless_json", "endless_sse"), "resultType": "complete"}
    elif method == "tools/call":
        name = message["params"]["name"]
        if name == "endless_json":
            return StreamingResponse(_endless(_head(request_id)), media_type="application/json")
        if name == "endless_sse":
            return StreamingResponse(_endless(b"data: " + _head(request_id)), media_type="text/event-stream")
        result = {**_OK, "resultType": "complete"}
    else:
        result = {}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    return Response(body.encode(), media_type="application/json", headers=headers)


async def serve_http() -> None:
    app = Starlette(routes=[Route("/mcp", _serve, methods=["POST", "GET", "DELETE"])])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [listener])
        while not server.started:
            await anyio.sleep(0.01)
        sys.stdout.write(f"LISTENING http://127.0.0.1:{port}/mcp\n")
        sys.stdout.flush()


def serve_stdio() -> None:
    out = sys.stdout.buffer
    for raw in sys.stdin.buffer:
        message = json.loads(raw)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "oversize", "version": "1"},
            }
        elif method == "tools/list":
            result = _tools("echo", "endless_line")
        elif method == "tools/call" and message["params"]["name"] == "endless_line":
            out.write(_head(request_id))
            while True:  # until the gateway stops reading and ends this process
                out.write(_PADDING)
        else:
            result = _OK if method == "tools/call" else {}
        out.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["stdio"]:
        serve_stdio()
    else:
        anyio.run(serve_http)
