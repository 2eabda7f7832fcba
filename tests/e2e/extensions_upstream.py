"""An upstream that declares extensions, one the gateway governs and one it does not (issue 24).

``io.modelcontextprotocol/ui`` (MCP Apps, the SDK's own ``Apps``): a tool whose
``_meta.ui.resourceUri`` names a ``ui://`` resource. ``com.example/unvetted``: an extension
with settings and a request method of its own, which the gateway has not been taught.
``resources/list`` carries list-level ``_meta`` of the server's own, beside a key in the
protocol's namespace that a gateway must not pass on.

    python -m tests.e2e.extensions_upstream            # stdio
    python -m tests.e2e.extensions_upstream --http     # prints LISTENING <url>
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from typing import Any

import anyio
from mcp.server.apps import Apps
from mcp.server.extension import Extension
from mcp.server.mcpserver import MCPServer
from mcp.types import ListResourcesResult, PaginatedRequestParams

from bastion.examples.tools_server import MCP_PATH, serve_announced

LIST_META = {"com.example/listing": {"generation": 7}, "io.modelcontextprotocol/forged": True}


class Unvetted(Extension):
    identifier = "com.example/unvetted"

    def settings(self) -> dict[str, Any]:
        return {"mode": "fast"}

    def methods(self) -> Sequence[Any]:
        return ()


def build_server() -> MCPServer[Any]:
    apps = Apps()

    @apps.tool(resource_uri="ui://clock/app.html", description="Current time, with a UI.")
    def clock() -> str:
        return "12:00"

    apps.add_html_resource("ui://clock/app.html", "<html><body>clock</body></html>")
    server: MCPServer[Any] = MCPServer("extensions", log_level="WARNING", extensions=[apps, Unvetted()])

    @server.tool(description="Plain tool.")
    def plain() -> str:
        return "plain"

    async def list_with_meta(ctx: Any, params: PaginatedRequestParams | None) -> ListResourcesResult:
        return ListResourcesResult(resources=await server.list_resources(), _meta=LIST_META)

    server._lowlevel_server.add_request_handler("resources/list", PaginatedRequestParams, list_with_meta)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.extensions_upstream")
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
