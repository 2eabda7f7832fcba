"""An HTTP MCP upstream that says what trace context each ``tools/call`` reached it with.

``python -m tests.e2e.recording_upstream`` serves the example tools (``hold`` included, as
``tests/e2e/holding_upstream.py`` does) and, for every ``tools/call`` it receives, prints one
line ``SEEN {"traceparent": <header>, "tracestate": <header>, "meta": <params._meta>}`` before
handing the request on. It prints ``LISTENING <url>`` once it accepts connections.

A test fixture and a program of its own: the lines it prints are its protocol.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import anyio
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bastion.examples.counter import FileCounter
from bastion.examples.tools_server import MCP_PATH, build_app
from tests.e2e.holding_upstream import build_server, read_releases

_READY_POLL_S = 0.01


class Recorder:
    """Reads each POST body, prints what trace context a tools/call carries, then replays it."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        self._record(scope, body)

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self._app(scope, replay, send)

    @staticmethod
    def _record(scope: Scope, body: bytes) -> None:
        try:
            request: Any = json.loads(body)
        except ValueError:
            return
        if not isinstance(request, dict) or request.get("method") != "tools/call":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        params = request.get("params") or {}
        seen = {
            "traceparent": headers.get("traceparent"),
            "tracestate": headers.get("tracestate"),
            "meta": params.get("_meta"),
        }
        sys.stdout.write(f"SEEN {json.dumps(seen)}\n")
        sys.stdout.flush()


async def serve() -> None:
    send, receive = anyio.create_memory_object_stream[None](16)
    app = build_app(
        build_server(FileCounter.from_environment(), receive), host="127.0.0.1", json_response=False
    )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            Recorder(app), log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2
        )
    )
    async with anyio.create_task_group() as tg:

        async def run_server() -> None:
            await server.serve([listener])
            tg.cancel_scope.cancel()

        tg.start_soon(read_releases, send)
        tg.start_soon(run_server)
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(_READY_POLL_S)
        sys.stdout.write(f"LISTENING http://127.0.0.1:{port}{MCP_PATH}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(serve)
