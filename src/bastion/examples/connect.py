"""Connect the official MCP Python SDK client to a running Bastion, in both eras.

``python -m bastion.examples.connect [--url URL] [--token-file FILE]`` lists
the tools and calls ``tools__echo`` and ``tools__slow`` (with progress), first
in the sessionless era (the SDK default), then in the session era. When it
cannot (no token file, no gateway at the URL), it says so in one line, what it
tried and what to do, and exits 1 (issue #26 point 4).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.upstream.failure import describe_failure

__all__ = ["main"]


async def _run(url: str, token: str, mode: str) -> None:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        print(f"    progress {progress:g}/{total:g}" if total else f"    progress {progress:g}")

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        print(f"{mode}: protocol {client.protocol_version}")
        tools = await client.list_tools()
        print("  tools:", ", ".join(t.name for t in tools.tools))
        echo = await client.call_tool("tools__echo", {"text": "hello through Bastion"})
        print("  tools__echo ->", echo.content[0].text)  # type: ignore[union-attr]
        slow = await client.call_tool(
            "tools__slow", {"seconds": 0.3, "steps": 3}, progress_callback=on_progress
        )
        print("  tools__slow ->", slow.content[0].text)  # type: ignore[union-attr]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bastion.examples.connect")
    parser.add_argument("--url", default="http://127.0.0.1:8765/mcp", help="the gateway's MCP endpoint")
    parser.add_argument(
        "--token-file", type=Path, default=Path(".bastion/demo-agent.token"), help="the agent token"
    )
    args = parser.parse_args()
    try:
        token = args.token_file.read_text().strip()
    except OSError as exc:
        print(
            f"connect: cannot read the agent token {args.token_file} ({exc.strerror});"
            " start the demo first (`make serve`) or pass --token-file",
            file=sys.stderr,
        )
        return 1
    try:
        for mode in ("auto", "legacy"):
            anyio.run(_run, args.url, token, mode)
    except Exception as exc:  # the one line a newcomer reads, not the SDK's task-group traceback
        print(
            f"connect: tried Bastion at {args.url} and failed ({describe_failure(exc)});"
            " start it with `make serve`, or pass the --url and --token-file its banner prints",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
