"""The task lifecycle the relay must equal, measured direct (issue 24).

The TypeScript SDK's server-everything serves the whole 2025-11-25 lifecycle (its
``simulate-research-query`` runs only as a task): this pins, as a transcript
(``tests/e2e/tasks_lifecycle.py``), what a client sees going direct, for the gateway's relay to
be compared against. The installed Python SDK client cannot be that client: it validates a
``tools/call`` answer as a ``CallToolResult``, so a session-era task reaches it as a validation
error; a test pins that too, so that a client change is seen.
"""

from __future__ import annotations

import anyio
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolRequest, CallToolRequestParams, CreateTaskResult, TaskMetadata
from pydantic import ValidationError

from tests.e2e.tasks_lifecycle import lifecycle, stdio_exchange
from tests.e2e.third_party.servers import npm_server

pytestmark = pytest.mark.anyio

RESEARCH = ("simulate-research-query", {"topic": "gateways"})


async def test_server_everything_serves_the_task_lifecycle_direct() -> None:
    with anyio.fail_after(60):
        async with stdio_exchange(npm_server("everything", "stdio")) as exchange:
            transcript = await lifecycle(exchange, *RESEARCH)
    assert transcript["created"]["status"] == "working"
    assert transcript["terminal"]["status"] == "completed"
    assert transcript["result_content_types"] == ["text"]
    assert [item["taskId"] for item in transcript["listed"]] == ["<the task>"]
    assert transcript["listed"][0]["status"] == "completed"
    # Cancelling a finished task and reading an unknown one: both invalid params.
    assert transcript["cancel_terminal"] == {"code": -32602}
    assert transcript["get_unknown"] == {"code": -32602}


async def test_the_python_sdk_client_cannot_receive_a_session_era_task() -> None:
    command = npm_server("everything", "stdio")
    params = StdioServerParameters(command=command[0], args=command[1:])
    request = CallToolRequest(
        params=CallToolRequestParams(name=RESEARCH[0], arguments=RESEARCH[1], task=TaskMetadata(ttl=60000))
    )
    with anyio.fail_after(60):
        async with Client(stdio_client(params), mode="legacy") as client:
            assert client.server_capabilities.tasks is not None  # the upstream offers tasks
            with pytest.raises(ValidationError, match="CallToolResult"):
                await client.session.send_request(request, CreateTaskResult)
