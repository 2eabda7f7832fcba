"""``create_app``: the only wiring of Bastion's HTTP surface.

Routes: ``/mcp`` (the front door), ``/healthz`` (process alive),
``/readyz`` (configuration loaded, upstreams reachable, per-upstream detail),
``/metrics`` (Prometheus). The lifespan starts the gateway (upstreams
launched or connected, catalog built) and stops it (client sessions closed,
stdio upstreams terminated).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.gateway import Gateway
from bastion.metrics import GatewayMetrics
from bastion.policy.snapshot import Snapshot
from bastion.transport.streamable_http import FrontDoor

__all__ = ["create_app"]


def create_app(snapshot: Snapshot, *, clock: Callable[[], float] = time.monotonic) -> Starlette:
    """Build the ASGI app for one gateway process (one replica)."""
    gateway = Gateway(snapshot, clock=clock)
    registry = CollectorRegistry()
    GatewayMetrics(registry, gateway)
    front = FrontDoor(
        snapshot=gateway.snapshot,
        auth=gateway.auth,
        registry=gateway.registry,
        router=gateway.router,
        close_session=gateway.close_transport_session,
    )

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        ready, detail = gateway.readiness()
        return JSONResponse(detail, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            await gateway.start(tg)
            try:
                yield
            finally:
                await gateway.aclose()
                tg.cancel_scope.cancel()

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/mcp", front),
        ],
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    return app
