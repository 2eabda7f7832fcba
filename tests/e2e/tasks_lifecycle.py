"""The 2025-11-25 task lifecycle as a transcript, over any JSON-RPC exchange (issue 24 tests).

:func:`lifecycle` drives one task from creation to its result (create, ``tasks/get`` until
terminal, ``tasks/result``, ``tasks/list``, ``tasks/cancel`` of the finished task, ``tasks/get``
of an unknown id) through an ``exchange`` coroutine (one request in, its response out) and
returns what a client sees, with ids and times replaced by their roles: the same transcript
direct and through the gateway is the relay's acceptance test. :func:`stdio_exchange` speaks to
an upstream directly over stdio, as raw JSON-RPC: the installed Python SDK client validates a
``tools/call`` answer as a ``CallToolResult`` and cannot receive a task.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import orjson

Exchange = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]

TASKS_CAPABILITY = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
_TASK_FIELDS = ("taskId", "status", "createdAt", "lastUpdatedAt")


@contextlib.asynccontextmanager
async def stdio_exchange(command: Sequence[str]) -> AsyncIterator[Exchange]:
    """An initialized 2025-11-25 session with ``command`` that declares the tasks capability."""
    ids = itertools.count(1)
    async with await anyio.open_process(list(command), stderr=None) as process:
        assert process.stdin is not None and process.stdout is not None
        stdin, stdout = process.stdin, process.stdout
        buffer = b""

        async def read_line() -> bytes:
            nonlocal buffer
            while b"\n" not in buffer:
                chunk = await stdout.receive()
                buffer += chunk
            line, buffer = buffer.split(b"\n", 1)
            return line

        async def exchange(method: str, params: dict[str, Any]) -> dict[str, Any]:
            request_id = next(ids)
            message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            await stdin.send(orjson.dumps(message) + b"\n")
            while True:
                answer = orjson.loads(await read_line())
                if answer.get("id") == request_id:
                    assert isinstance(answer, dict)
                    return answer

        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tasks": TASKS_CAPABILITY},
            "clientInfo": {"name": "tasks-lifecycle", "version": "0"},
        }
        assert "result" in await exchange("initialize", init)
        await stdin.send(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + b"\n")
        try:
            yield exchange
        finally:
            process.kill()


def _task_shape(task: dict[str, Any], task_id: str) -> dict[str, Any]:
    assert all(field in task for field in _TASK_FIELDS), task
    shape = {key: value for key, value in task.items() if key not in ("createdAt", "lastUpdatedAt")}
    shape["taskId"] = "<the task>" if task["taskId"] == task_id else "<another task>"
    shape.pop("statusMessage", None)  # progress text, timing-dependent
    return shape


def _error_shape(answer: dict[str, Any]) -> dict[str, Any]:
    error = answer["error"]
    return {"code": error["code"]}


async def lifecycle(
    exchange: Exchange, tool: str, arguments: dict[str, Any], *, poll_s: float = 0.25
) -> dict[str, Any]:
    """What a client sees of one task, ids and times by role. Bounded by the caller's deadline."""
    created = await exchange("tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": 60000}})
    task = created["result"]["task"]
    task_id = task["taskId"]
    transcript: dict[str, Any] = {"created": _task_shape(task, task_id)}
    while True:
        got = (await exchange("tasks/get", {"taskId": task_id}))["result"]
        if got["status"] not in ("working", "input_required"):
            break
        await anyio.sleep(poll_s)
    transcript["terminal"] = _task_shape(got, task_id)
    result = (await exchange("tasks/result", {"taskId": task_id}))["result"]
    transcript["result_content_types"] = [item["type"] for item in result["content"]]
    listed = (await exchange("tasks/list", {}))["result"]["tasks"]
    transcript["listed"] = [_task_shape(item, task_id) for item in listed]
    transcript["cancel_terminal"] = _error_shape(await exchange("tasks/cancel", {"taskId": task_id}))
    transcript["get_unknown"] = _error_shape(await exchange("tasks/get", {"taskId": "0" * 32}))
    return transcript
