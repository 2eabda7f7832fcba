"""An HTTP MCP upstream for ``tests/e2e/test_workers_e2e.py``: a side effect that answers when released.

``python -m tests.e2e.holding_upstream`` serves the example tools plus
``hold``: it adds one to the side-effect counter (``BASTION_COUNTER_FILE``),
prints ``HOLD <count>``, then waits for one line ``RELEASE`` on its stdin
before it answers. The test thus knows, without sleeping, that the upstream
received a call, and decides when the call returns. It prints
``LISTENING <url>`` once it accepts connections.

A test fixture and a program of its own: the lines it prints are its protocol.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import anyio
import uvicorn
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.mcpserver import MCPServer

from bastion.examples.common_tools import add_common_tools
from bastion.examples.counter import FileCounter
from bastion.examples.tools_server import MCP_PATH, build_app

_READY_POLL_S = 0.01


def build_server(counter: FileCounter, releases: MemoryObjectReceiveStream[None]) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("workers-e2e-upstream", version="0.1.0", log_level="WARNING")
    add_common_tools(server, counter)

    @server.tool(structured_output=False)
    async def hold() -> int:
        """Add one to the counter, say so on stdout, and answer once released (a slow side effect)."""
        count = counter.increment()
        sys.stdout.write(f"HOLD {count}\n")
        sys.stdout.flush()
        await releases.receive()
        return count

    return server


async def read_releases(releases: MemoryObjectSendStream[None]) -> None:
    """One ``RELEASE`` line on stdin lets one held call answer; EOF ends the reader."""
    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)
    pending = b""
    async with releases:
        while True:
            await anyio.wait_readable(fd)
            chunk = os.read(fd, 4096)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip() == b"RELEASE":
                    await releases.send(None)


async def serve() -> None:
    send, receive = anyio.create_memory_object_stream[None](16)
    app = build_app(
        build_server(FileCounter.from_environment(), receive), host="127.0.0.1", json_response=False
    )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    )
    async with anyio.create_task_group() as tg:

        async def run_server() -> None:
            await server.serve([listener])
            tg.cancel_scope.cancel()  # stopped (SIGTERM): stop reading stdin too

        tg.start_soon(read_releases, send)
        tg.start_soon(run_server)
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(_READY_POLL_S)
        sys.stdout.write(f"LISTENING http://127.0.0.1:{port}{MCP_PATH}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(serve)
