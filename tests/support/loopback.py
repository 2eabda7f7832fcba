"""Run a gateway app on a loopback socket inside the current event loop (for tests and benchmarks).

``httpx``'s ASGI transport buffers whole responses, which hides SSE
streaming; a real socket does not, so end-to-end tests use this.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from bastion.transport.limits import FrontDoorLimits, uvicorn_options

__all__ = ["loopback_config", "serve_on_loopback"]


def loopback_config(app: ASGIApp, limits: FrontDoorLimits | None = None) -> uvicorn.Config:
    """uvicorn settings for a test server: a free port on 127.0.0.1, quiet, quick to stop."""
    extra = uvicorn_options(limits) if limits is not None else {}
    return uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
        **extra,
    )


@contextlib.asynccontextmanager
async def serve_on_loopback(
    app: Starlette, *, startup_timeout_s: float = 30.0, limits: FrontDoorLimits | None = None
) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port); yields the ``/mcp`` URL, stops on exit.

    ``limits`` applies the front door's pre-authentication bounds, as ``bastion serve`` does.
    """
    server = uvicorn.Server(loopback_config(app, limits))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(startup_timeout_s):
            while not server.started:
                if server.should_exit:
                    raise RuntimeError("gateway failed to start")
                await anyio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            # uvicorn closes connections (graceful timeout 2 s), then runs the app's shutdown.
            server.should_exit = True
