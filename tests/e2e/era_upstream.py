"""An HTTP MCP upstream in both eras for ``tests/e2e/test_era_pairings.py`` (issue #8).

``python -m tests.e2e.era_upstream`` serves the example tools (``slow`` for
progress, ``hang`` for cancellation, ``ask_user`` for elicitation,
``summarize`` for sampling) plus:

- ``chatty``: one log message at each of debug, info, warning and error;
- ``where``: the client's roots (``roots/list``), through the SDK's resolver;
- ``regional``: an ``x-mcp-header`` parameter (``Mcp-Param-Region``), which
  the SDK server checks against the body on the 2026-07-28 wire;
- ``confirm``: a tool written in the 2026 input-required style by hand
  (returns ``InputRequiredResult``, then reads ``ctx.input_responses``);
- ``roots_changed``: how many ``notifications/roots/list_changed`` arrived;
- ``grow``: registers a tool at run time and announces it on
  ``subscriptions/listen``.

It prints ``LISTENING <url>`` once it accepts connections. A test fixture and
a program of its own: the line it prints is its protocol.
"""

from __future__ import annotations

import socket
import sys
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, ListRoots, MCPServer, Resolve
from mcp_types import (
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    ListRootsResult,
    NotificationParams,
)
from pydantic import Field

from bastion.examples.common_tools import add_common_tools
from bastion.examples.counter import FileCounter
from bastion.examples.tools_server import MCP_PATH, build_app

_READY_POLL_S = 0.01


def _list_roots() -> ListRoots:
    return ListRoots()


def build_server(counter: FileCounter) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("era-upstream", version="0.1.0", log_level="WARNING")
    add_common_tools(server, counter)
    roots_changes: list[str] = []

    async def on_roots_changed(context: Any, params: NotificationParams) -> None:
        roots_changes.append("changed")

    server._lowlevel_server.add_notification_handler(  # the SDK's own registration hook
        "notifications/roots/list_changed", NotificationParams, on_roots_changed
    )

    @server.tool(structured_output=False)
    async def roots_changed() -> int:
        """How many ``notifications/roots/list_changed`` this server has received."""
        return len(roots_changes)

    @server.tool(structured_output=False)
    async def hang() -> str:
        """Never return (until cancelled)."""
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool(structured_output=False)
    async def chatty(ctx: Context) -> str:
        """Log one message at each of four levels, then answer."""
        for level in ("debug", "info", "warning", "error"):
            await ctx.log(level, f"{level} message")
        return "logged"

    @server.tool(structured_output=False)
    async def where(roots: Annotated[ListRootsResult, Resolve(_list_roots)]) -> str:
        """Answer with the client's root URIs."""
        return " ".join(str(root.uri) for root in roots.roots)

    @server.tool(structured_output=False)
    async def regional(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], text: str
    ) -> str:
        """Answer ``<region>:<text>``; the region travels as the ``Mcp-Param-Region`` header too."""
        return f"{region}:{text}"

    @server.tool(structured_output=False)
    async def confirm(ctx: Context) -> str | InputRequiredResult:
        """Ask for a confirmation the 2026 way (input required), then report the answer."""
        responses = ctx.input_responses or {}
        answer = responses.get("ok")
        if answer is None:
            ask = ElicitRequest(
                params=ElicitRequestFormParams(
                    message="proceed?",
                    requested_schema={"type": "object", "properties": {"answer": {"type": "string"}}},
                )
            )
            return InputRequiredResult(input_requests={"ok": ask}, request_state="confirm-1")
        content = getattr(answer, "content", None) or {}
        return f"confirmed:{content.get('answer')}:{ctx.request_state}"

    @server.tool(structured_output=False)
    async def grow(name: str, ctx: Context) -> str:
        """Register an echo tool called ``name`` and announce it to listeners."""

        def extra(text: str) -> str:
            return f"{name}: {text}"

        server.add_tool(extra, name=name, description=f"Echo, registered at run time as {name}.")
        await ctx.notify_tools_changed()  # 2026-07-28 listeners
        if ctx.protocol_version != "2026-07-28":
            await ctx.session.send_tool_list_changed()  # this session (session era)
        return f"registered {name}"

    return server


async def _serve() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    app = build_app(build_server(FileCounter.from_environment()), host="127.0.0.1", json_response=False)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2
    )
    uvicorn_server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(uvicorn_server.serve, [listener])
        while not uvicorn_server.started:
            await anyio.sleep(_READY_POLL_S)
        sys.stdout.write(f"LISTENING http://127.0.0.1:{port}{MCP_PATH}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(_serve)
