"""An HTTP MCP upstream that accepts ``tools/call`` and closes its stream without ever answering.

Tool ``drop`` answers with an event stream that ends before the answer; tool
``accept`` answers 202, as to a notification.

Either era, as the gateway pins it: sessionless (no resumption possible) or
session era, where each event carries an id and a short ``retry:`` so the
gateway may resume with ``GET`` and ``Last-Event-ID``; every resumed stream
also ends empty. ``calls`` counts the calls received and ``resumes`` the GETs,
so a test knows the send happened and resumption was tried.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["DroppingUpstream"]

_SESSION_ID = "dropping-session"


class DroppingUpstream:
    """The Starlette app and what it saw."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.resumes: list[str] = []
        self.app = Starlette(routes=[Route("/mcp", self._serve, methods=["POST", "GET", "DELETE"])])

    async def _serve(self, request: Request) -> Response:
        if request.method == "GET":
            self.resumes.append(request.headers.get("last-event-id", ""))
            return Response(b"retry: 20\n\n", media_type="text/event-stream")
        if request.method == "DELETE":
            return Response(status_code=200)
        message: dict[str, Any] = json.loads(await request.body())
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            return Response(status_code=202)
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "dropping", "version": "1"},
            }
            return _answer(request_id, result, {"mcp-session-id": _SESSION_ID})
        if method == "tools/list":
            tools = [{"name": name, "inputSchema": {"type": "object"}} for name in ("drop", "accept")]
            return _answer(request_id, {"tools": tools, "resultType": "complete"})
        if method == "tools/call":
            name = message["params"]["name"]
            self.calls.append(name)
            if name == "accept":
                return Response(status_code=202)  # taken as if it were a notification: no answer ever
            # One event that is not the answer (with an id, so a session may resume), then the end.
            progress = {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": "info", "data": "x"},
            }
            body = f"id: e1\nretry: 20\ndata: {json.dumps(progress)}\n\n"
            return Response(body.encode(), media_type="text/event-stream")
        return _answer(request_id, {})


def _answer(request_id: Any, result: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    return Response(body.encode(), media_type="application/json", headers=headers)
