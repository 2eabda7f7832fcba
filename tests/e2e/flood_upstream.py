"""A stdio MCP upstream for ``tests/e2e/test_stdio_backpressure.py`` (issue 12, point 1).

``python -m tests.e2e.flood_upstream`` serves ``echo`` and ``flood``: ``flood``
reports ``count`` progress notifications, each carrying a message of ``size``
characters, as fast as it can, then answers. A client that never reads its
stream thus has far more bytes coming than the kernel's socket buffers hold.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer


def build_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("flood-upstream", version="0.1.0", log_level="WARNING")

    @server.tool(structured_output=False)
    async def echo(text: str) -> str:
        """Return ``text`` unchanged."""
        return text

    @server.tool(structured_output=False)
    async def flood(count: int, size: int, ctx: Context) -> str:
        """Report ``count`` progress notifications of about ``size`` bytes each, then answer."""
        padding = "x" * size
        for done in range(1, count + 1):
            await ctx.report_progress(done, count, padding)
        return "flooded"

    return server


if __name__ == "__main__":
    build_server().run("stdio")
