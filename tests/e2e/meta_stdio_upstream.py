"""A stdio MCP upstream whose one tool answers with the ``_meta`` its call arrived with.

``python -m tests.e2e.meta_stdio_upstream``: ``seen_meta`` (read-only, no arguments) returns the
request's ``_meta`` as JSON text, so a test sees what trace context reached a stdio upstream.
A stdio server owns stdout for the protocol: nothing here may print.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations


def build_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("meta-stdio-upstream", version="0.1.0", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
    async def seen_meta(ctx: Context) -> str:
        """The ``_meta`` of this request, as JSON."""
        meta = ctx.request_context.meta
        return json.dumps(dict(meta) if meta else {}, default=str)

    return server


if __name__ == "__main__":
    build_server().run("stdio")
