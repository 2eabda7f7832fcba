"""A FastMCP 4 server with an MCP Apps tool (issue 24), run by FastMCP 4's own interpreter.

FastMCP 4 declares ``io.modelcontextprotocol/ui`` on its 2026 face. ``clock``'s
``_meta.ui.resourceUri`` names the ``ui://`` resource it renders. Does not import bastion.

    <fastmcp4 python> tests/e2e/third_party/fastmcp4_apps.py PORT
"""

from __future__ import annotations

import sys

from fastmcp import FastMCP

server = FastMCP("fastmcp4-apps")


@server.tool(meta={"ui": {"resourceUri": "ui://clock/app.html"}})
def clock() -> str:
    """Current time, with a UI."""
    return "12:00"


@server.resource("ui://clock/app.html", mime_type="text/html;profile=mcp-app")
def clock_app() -> str:
    return "<html><body>clock</body></html>"


if __name__ == "__main__":
    server.run(
        transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False, log_level="warning"
    )
