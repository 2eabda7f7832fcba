"""A FastMCP 2.x server (``mcp`` 1.x underneath) whose tools speak outside their request (issue 22).

Run by the FastMCP 2 interpreter of ``tests/e2e/third_party/servers.py`` (never imports bastion):
``python fastmcp2_session_server.py PORT``. On ``mcp`` 1.x, what a tool sends without a related
request id goes on the session's standalone GET stream: ``ctx.list_roots()`` (``which_roots``),
log messages sent after the tool returned (``tick_later``), and the ``tools/list_changed`` that
adding a tool sends to the calling session only (``grow``).
"""

from __future__ import annotations

import asyncio
import sys

from fastmcp import Context, FastMCP

server = FastMCP("session-speaker")
_background: set[asyncio.Task[None]] = set()


@server.tool
async def which_roots(ctx: Context) -> str:
    """The calling client's roots, asked of it with roots/list from inside the tool."""
    roots = await ctx.list_roots()
    return ",".join(sorted(str(root.uri) for root in roots))


@server.tool
async def tick_later(count: int, ctx: Context) -> str:
    """Send ``count`` log messages to the calling session once this call has returned."""
    session = ctx.session

    async def ticks() -> None:
        await asyncio.sleep(0.3)
        for n in range(count):
            await session.send_log_message(level="warning", data=f"tick {n}", logger="ticks")
            await asyncio.sleep(0.05)

    task = asyncio.create_task(ticks())
    _background.add(task)
    task.add_done_callback(_background.discard)
    return "scheduled"


@server.tool
async def grow(name: str, ctx: Context) -> str:
    """Add a tool ``name`` and tell the calling session (and only it) that the tools changed."""

    def fresh() -> str:
        return f"{name} is here"

    server.tool(fresh, name=name)
    await ctx.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    server.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
