"""The conformance fixture itself: where it departs from the bare SDK, it does so as the spec says."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.issue4_support import answer_of, rpc
from tests.e2e.upstream_support import listening_upstream

pytestmark = pytest.mark.anyio


async def test_an_unknown_tool_is_a_protocol_error_not_a_tool_result() -> None:
    """Calling a tool the fixture lacks gets JSON-RPC -32602 "Unknown tool", as Bastion answers it."""
    argv = [sys.executable, "-m", "tests.fixtures.conformance_server", "--port", "0"]
    with listening_upstream(argv) as url:
        async with (
            httpx2.AsyncClient(timeout=30) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            with anyio.fail_after(30), pytest.raises(MCPError) as refused:
                await client.call_tool("no_such_tool", {})
            known = await client.call_tool("greet", {"name": "x"})
    assert refused.value.error.code == -32602
    assert refused.value.error.message == "Unknown tool: no_such_tool"
    assert known.is_error is False


_TASKS = "io.modelcontextprotocol/tasks"
_OPT_IN = {"_meta": {"io.modelcontextprotocol/clientCapabilities": {"extensions": {_TASKS: {}}}}}
_SESSION_VERSION = "2025-11-25"
_ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class _Session:
    """One session-era transport session on the fixture, spoken raw (to see the wire as it is)."""

    def __init__(self, http: httpx.AsyncClient, url: str, session_id: str, initialized: dict[str, Any]):
        self.http, self.url, self.session_id, self.initialized = http, url, session_id, initialized
        self._ids = iter(range(2, 10_000))

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        headers = {**_ACCEPT, "mcp-session-id": self.session_id, "mcp-protocol-version": _SESSION_VERSION}
        response = await self.http.post(self.url, headers=headers, json=rpc(method, params, request_id))
        return answer_of(response, request_id)


@asynccontextmanager
async def _fixture_sessions(*capabilities: dict[str, Any]) -> AsyncIterator[list[_Session]]:
    """One fixture process, and one session-era session per capability set given."""
    argv = [sys.executable, "-m", "tests.fixtures.conformance_server", "--port", "0"]
    with listening_upstream(argv) as url:
        async with httpx.AsyncClient(timeout=30) as http:
            sessions = []
            for caps in capabilities:
                init = {
                    "protocolVersion": _SESSION_VERSION,
                    "capabilities": caps,
                    "clientInfo": {"name": "t", "version": "1"},
                }
                response = await http.post(url, headers=_ACCEPT, json=rpc("initialize", init))
                session_id = response.headers["mcp-session-id"]
                headers = {**_ACCEPT, "mcp-session-id": session_id, "mcp-protocol-version": _SESSION_VERSION}
                await http.post(url, headers=headers, json=rpc("notifications/initialized", request_id=None))
                sessions.append(_Session(http, url, session_id, answer_of(response)["result"]))
            yield sessions


async def _settled(session: _Session, task_id: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    with anyio.fail_after(10):
        while True:
            detail = (await session.request("tasks/get", {"taskId": task_id, **(params or {})}))["result"]
            if detail["status"] in {"completed", "failed", "cancelled"}:
                return detail
            await anyio.sleep(0.1)


async def test_the_session_era_negotiates_tasks_at_initialize_and_any_session_reaches_a_task() -> None:
    """Declared at initialize: a task tool answers a flat CreateTaskResult; another session (which
    declared nothing) reaches the same task by opting in on its own request."""
    async with _fixture_sessions({"extensions": {_TASKS: {}}}, {}) as (declaring, plain):
        assert _TASKS in declaring.initialized["capabilities"]["extensions"]
        created = await declaring.request(
            "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.3}}
        )
        task = created["result"]
        assert task["resultType"] == "task" and task["status"] == "working" and "task" not in task
        assert isinstance(task["ttlMs"], int) and isinstance(task["pollIntervalMs"], int)
        refused = await plain.request("tasks/get", {"taskId": task["taskId"]})
        assert refused["error"]["code"] == -32021
        assert refused["error"]["data"] == {"requiredCapabilities": {"extensions": {_TASKS: {}}}}
        detail = await _settled(plain, task["taskId"], _OPT_IN)
    assert detail["status"] == "completed" and detail["resultType"] == "complete"
    assert detail["result"]["content"][0]["text"].startswith("computed")


async def test_the_session_era_without_the_extension_runs_sync_refuses_required_and_honours_opt_in() -> None:
    async with _fixture_sessions({}) as (plain,):
        sync = (await plain.request("tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}}))[
            "result"
        ]
        required = await plain.request("tools/call", {"name": "failing_job", "arguments": {}})
        opted = await plain.request("tools/call", {"name": "failing_job", "arguments": {}, **_OPT_IN})
        listed = (await plain.request("tools/list", {}))["result"]["tools"]
        detail = await _settled(plain, opted["result"]["taskId"], _OPT_IN)
    assert "taskId" not in sync and sync["content"]
    assert required["error"]["code"] == -32021
    assert opted["result"]["resultType"] == "task"
    assert detail["status"] == "completed" and detail["result"]["isError"] is True
    support = {tool["name"]: tool.get("execution", {}).get("taskSupport") for tool in listed}
    assert support["slow_compute"] == "optional" and support["failing_job"] == "required"
    assert support["greet"] is None


async def test_a_task_asks_by_input_requests_and_resumes_on_update_and_cancel_is_idempotent() -> None:
    async with _fixture_sessions({"extensions": {_TASKS: {}}}) as (session,):
        created = await session.request("tools/call", {"name": "multi_input", "arguments": {}})
        task_id = created["result"]["taskId"]
        with anyio.fail_after(10):
            while (detail := (await session.request("tasks/get", {"taskId": task_id}))["result"])[
                "status"
            ] != ("input_required"):
                await anyio.sleep(0.05)
        assert set(detail["inputRequests"]) == {"name", "confirm"}
        assert detail["inputRequests"]["name"]["method"] == "elicitation/create"
        answer = {"action": "accept", "content": {"name": "n", "confirm": True}}
        ack = await session.request("tasks/update", {"taskId": task_id, "inputResponses": {"name": answer}})
        partial = (await session.request("tasks/get", {"taskId": task_id}))["result"]
        await session.request("tasks/update", {"taskId": task_id, "inputResponses": {"confirm": answer}})
        done = await _settled(session, task_id)
        cancelled = await session.request("tasks/cancel", {"taskId": task_id})
        unknown = await session.request("tasks/cancel", {"taskId": "no-such-task"})
        removed = await session.request("tasks/list", {})
    assert ack["result"] == {"resultType": "complete"}
    assert partial["status"] == "input_required" and list(partial["inputRequests"]) == ["confirm"]
    assert done["status"] == "completed" and "inputRequests" not in done
    assert cancelled["result"] == {"resultType": "complete"} and done["status"] == "completed"
    assert unknown["error"]["code"] == -32602
    assert removed["error"]["code"] == -32601
