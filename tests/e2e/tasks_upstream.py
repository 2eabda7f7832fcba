"""An upstream that answers with tasks, on the SDK's task types (issue 24 tests).

The installed SDK serves no tasks itself (no ``tasks/get`` or ``tasks/result``); this fixture only
makes them. ``compute`` runs as a plain call, and answers a task (``CreateTaskResult``) when the
call carries ``params.task``: what reaches it says whether an augmentation got through (the SDK's
own result sieve turns that answer into an error on a session-era wire). ``research`` runs only
as a task (``taskSupport: "required"``, refused as a plain call, as the TypeScript SDK refuses
one). ``insists_2026`` answers every call with a 2026 task (``resultType: "task"``), which the SDK
delivers on its 2026 wire (``--http``). ``tasks_made`` says how many tasks this process made.

    python -m tests.e2e.tasks_upstream            # stdio
    python -m tests.e2e.tasks_upstream --http     # prints LISTENING <url>
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import warnings
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    CreateTaskResult,
    ListToolsResult,
    PaginatedRequestParams,
    Result,
    Task,
    TextContent,
    Tool,
)

from bastion.examples.tools_server import MCP_PATH, serve_announced

_TOOLS = [
    Tool(name="compute", input_schema={"type": "object"}, execution={"taskSupport": "optional"}),
    Tool(name="research", input_schema={"type": "object"}, execution={"taskSupport": "required"}),
    Tool(name="tasks_made", input_schema={"type": "object"}),
    Tool(name="insists_2026", input_schema={"type": "object"}),
]


class FlatTaskResult(Result):
    """The 2026 tasks extension's ``CreateTaskResult``: ``resultType: "task"``, the task flat."""

    result_type: str = "task"
    task_id: str
    status: str
    created_at: str
    last_updated_at: str


def build_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("tasks", log_level="WARNING")
    made = itertools.count(1)
    count = 0

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=_TOOLS)

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> Result:
        nonlocal count
        if params.name == "tasks_made":
            return CallToolResult(content=[TextContent(type="text", text=str(count))])
        now = datetime.datetime.now(datetime.UTC).isoformat()
        if params.name == "insists_2026":
            count += 1
            return FlatTaskResult(
                task_id=f"task-{next(made)}", status="working", created_at=now, last_updated_at=now
            )
        if params.task is not None:
            count += 1
            task = Task(task_id=f"task-{next(made)}", status="working", created_at=now, last_updated_at=now)
            return CreateTaskResult(task=task)
        if params.name == "research":
            raise MCPError(-32601, "Tool research requires task augmentation (taskSupport: 'required')")
        return CallToolResult(content=[TextContent(type="text", text="computed")])

    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("tools/list", PaginatedRequestParams, list_tools)
    lowlevel.add_request_handler("tools/call", CallToolRequestParams, call_tool)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.tasks_upstream")
    parser.add_argument("--http", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    server = build_server()
    if not args.http:
        server.run("stdio")
        return
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host="127.0.0.1")
    anyio.run(lambda: serve_announced(app, host="127.0.0.1", port=0))


if __name__ == "__main__":
    main()
