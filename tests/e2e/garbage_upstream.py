"""A sessionless HTTP MCP upstream that answers ``tools/call`` with bytes no real server should send.

It speaks just enough of the 2026-07-28 wire for the gateway (pinned
``era = "sessionless"``) to list its tools, then answers each tool with one
defect after the call arrived: the upstream has acted, the answer is garbage.
``calls`` counts the calls it received, so a test knows the send happened.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["GARBAGE", "GARBAGE_ERRORS", "GarbageUpstream"]

_OK = '{"content":[{"type":"text","text":"ok"}]'


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: tool name -> the raw ``result`` text it answers with (``{id}`` is the request id).
GARBAGE: dict[str, str] = {
    "nan": _OK + ',"score":NaN}',
    "infinity": _OK + ',"score":-Infinity}',
    "surrogate": '{"content":[{"type":"text","text":"\\ud800"}]}',
    "surrogate_key": _OK + ',"\\udc00":1}',
    "deep": _OK + f',"tree":{_nested(150)}}}',
    "very_deep": _OK + f',"tree":{_nested(50_000)}}}',
    "huge_integer": _OK + f',"n":{2**70}}}',
    "meta_not_object": _OK + ',"_meta":"x"}',
    "not_object": "5",
}

#: tool name -> the raw JSON-RPC ``error`` object it answers with instead of a result.
GARBAGE_ERRORS: dict[str, str] = {
    "error_nan": '{"code":-32000,"message":"failed","data":{"score":NaN}}',
    "error_surrogate": '{"code":-32000,"message":"\\ud800"}',
    "error_deep": f'{{"code":-32000,"message":"failed","data":{_nested(150)}}}',
}


class GarbageUpstream:
    """The Starlette app and what it saw."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.app = Starlette(routes=[Route("/mcp", self._post, methods=["POST"])])

    async def _post(self, request: Request) -> Response:
        message: dict[str, Any] = json.loads(await request.body())
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            return Response(status_code=202)
        if method == "tools/list":
            tools = [
                {"name": name, "inputSchema": {"type": "object"}} for name in (*GARBAGE, *GARBAGE_ERRORS)
            ]
            return _answer(request_id, json.dumps({"tools": tools, "resultType": "complete"}))
        if method == "tools/call":
            name = message["params"]["name"]
            self.calls.append(name)
            if name in GARBAGE_ERRORS:
                return _answer(request_id, GARBAGE_ERRORS[name], member="error")
            return _answer(request_id, GARBAGE[name])
        return _answer(request_id, "{}")


def _answer(request_id: Any, result: str, member: str = "result") -> Response:
    body = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"{member}":{result}}}'
    return Response(body.encode(), media_type="application/json")
