"""An upstream that serves 2025-11-25 tasks, on the SDK's task types (issue 24 tests).

``compute`` runs as a plain call or, asked with ``params.task``, as a task (``CreateTaskResult``,
then ``tasks/get`` / ``tasks/result``); ``research`` runs only as a task (``taskSupport:
"required"``, refused as a plain call, as the TypeScript SDK refuses one). ``tasks_made`` says
how many tasks this process created, so a test sees whether an augmentation reached it.

    python -m tests.e2e.tasks_upstream            # stdio
"""

from __future__ import annotations

import datetime
import itertools
import warnings
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    CreateTaskResult,
    ListToolsResult,
    PaginatedRequestParams,
    Task,
    TextContent,
    Tool,
)

_TOOLS = [
    Tool(name="compute", input_schema={"type": "object"}, execution={"taskSupport": "optional"}),
    Tool(name="research", input_schema={"type": "object"}, execution={"taskSupport": "required"}),
    Tool(name="tasks_made", input_schema={"type": "object"}),
]


def build_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("tasks", log_level="WARNING")
    made = itertools.count(1)
    count = 0

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        return ListToolsResult(tools=_TOOLS)

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult | CreateTaskResult:
        nonlocal count
        if params.name == "tasks_made":
            return CallToolResult(content=[TextContent(type="text", text=str(count))])
        if params.task is not None:
            count += 1
            now = datetime.datetime.now(datetime.UTC).isoformat()
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
    warnings.simplefilter("ignore")
    build_server().run("stdio")


if __name__ == "__main__":
    main()
