"""A Streamable HTTP MCP server for tests, demos and ``bench/``.

Run as ``python -m bastion.examples.tools_server --host 127.0.0.1 --port 0
[--json-response]``. Once it accepts connections it prints exactly one line,
``LISTENING http://<host>:<port>/mcp``, to stdout and flushes, so a parent
that asked for port 0 learns the port.

One ASGI app serves both protocol eras (DESIGN section 0): the SDK's
``StreamableHTTPSessionManager`` sends a POST whose ``MCP-Protocol-Version``
header names a 2026-07-28 revision to its single-exchange path (no session),
and everything else, ``initialize`` included, to the session-era transport
(``Mcp-Session-Id``). That is why the app is built stateful
(``stateless_http=False``): stateless would only drop the session era's
sessions, not add the sessionless era. ``--json-response`` answers
``application/json`` instead of opening an SSE stream; progress then has no
stream to ride on.

Tools: the shared ones of ``common_tools.py`` plus ``hang`` (never returns)
and ``fail`` (an ``isError`` result). The counter lives in the file named by
``BASTION_COUNTER_FILE``.

This is a test fixture, not part of the gateway, and a program of its own:
the one line it prints is its readiness protocol.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.applications import Starlette

from bastion.examples.common_tools import READ_ONLY, add_common_tools
from bastion.examples.counter import FileCounter

__all__ = ["build_app", "build_server", "main", "serve_announced"]

MCP_PATH = "/mcp"
_READY_POLL_S = 0.01


def build_server(counter: FileCounter) -> MCPServer[Any]:
    """The tools server, keeping its side-effect count in ``counter``."""
    server: MCPServer[Any] = MCPServer("bastion-example-tools", version="0.1.0", log_level="WARNING")
    add_common_tools(server, counter)

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def hang() -> str:
        """Never return (until cancelled), for timeout tests."""
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def fail() -> str:
        """Always answer with an ``isError`` result."""
        raise ToolError("this tool always fails")

    return server


def build_app(server: MCPServer[Any], *, host: str, json_response: bool) -> Starlette:
    """The ASGI app serving ``server`` at ``/mcp`` in both protocol eras."""
    return server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        json_response=json_response,
        stateless_http=False,
        host=host,
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bastion.examples.tools_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--json-response", action="store_true", help="answer JSON instead of SSE")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    app = build_app(
        build_server(FileCounter.from_environment()), host=args.host, json_response=args.json_response
    )
    await serve_announced(app, host=args.host, port=args.port)


async def serve_announced(app: Starlette, *, host: str, port: int) -> None:
    """Serve ``app`` at ``host:port`` (0 picks one) and print ``LISTENING <url>`` once ready."""
    # Bind before uvicorn starts so port 0 resolves to a real port we can announce. The explicit
    # IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # accepted sockets copy the listener's; with proto 0 every keep-alive answer waits ~40 ms
    # for a delayed ACK (Nagle).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    port = listener.getsockname()[1]

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
    )
    uvicorn_server = uvicorn.Server(config)
    finished = anyio.Event()

    async def serve() -> None:
        try:
            await uvicorn_server.serve([listener])
        finally:
            finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        # `started` turns true after the lifespan (the session manager's task
        # group) is up and the socket is being served: only then announce.
        while not uvicorn_server.started:
            if finished.is_set():
                return
            await anyio.sleep(_READY_POLL_S)
        shown_host = f"[{host}]" if family == socket.AF_INET6 else host
        sys.stdout.write(f"LISTENING http://{shown_host}:{port}{MCP_PATH}\n")
        sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM."""
    anyio.run(_serve, _parse_args(argv))


if __name__ == "__main__":
    main()
