"""Connect the official MCP Python SDK client to a running Bastion, in both eras.

``python -m bastion.examples.connect [--url URL] [--token-file FILE]`` lists
the tools and calls ``tools__echo`` and ``tools__slow`` (with progress), first
in the sessionless era (the SDK default), then in the session era.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bastion.examples.connect")
    parser.add_argument("--url", default="http://127.0.0.1:8765/mcp")
    parser.add_argument("--token-file", type=Path, default=Path(".bastion/demo-agent.token"))
    args = parser.parse_args()
    token = args.token_file.read_text().strip()
    for mode in ("auto", "legacy"):
        anyio.run(_run, args.url, token, mode)


if __name__ == "__main__":
    main()
