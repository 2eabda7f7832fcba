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
from typing import Any

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bastion.audit.read_paths import EvidenceReadPaths
from bastion.auth.bearer import StaticBearerAuth
from bastion.gateway import Gateway, RuntimeOptions
from bastion.metrics import GatewayMetrics
from bastion.policy.snapshot import Snapshot
from bastion.store.base import Store
from bastion.transport.streamable_http import FrontDoor

__all__ = ["create_app"]


def create_app(
    snapshot: Snapshot,
    options: RuntimeOptions,
    *,
    auditor_token_hashes: frozenset[str] = frozenset(),
    clock: Callable[[], float] = time.monotonic,
) -> Starlette:
    """Build the ASGI app for one gateway process (one replica).

    The gateway itself is built when the app starts (its lifespan), inside the
    event loop that will serve it; ``app.state.gateway`` is set from then on.
    """
    registry = CollectorRegistry()
    state: dict[str, Any] = {}

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readyz(request: Request) -> Response:
        gateway: Gateway | None = state.get("gateway")
        if gateway is None:
            return JSONResponse({"ready": False, "detail": "starting"}, status_code=503)
        ready, detail = gateway.readiness()
        return JSONResponse(detail, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    class _Mcp:
        # An ASGI app (not a function) so Starlette hands it the raw scope.
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await state["front"](scope, receive, send)

    def store() -> Store:
        gateway: Gateway = state["gateway"]
        assert gateway.store is not None
        return gateway.store

    def auth() -> StaticBearerAuth:
        gateway: Gateway = state["gateway"]
        return gateway.auth()

    evidence = EvidenceReadPaths(store, auth, auditor_token_hashes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gateway = Gateway(snapshot, options, clock=clock)
        GatewayMetrics(registry, gateway)
        state["gateway"] = app.state.gateway = gateway
        async with anyio.create_task_group() as tg:
            try:
                await gateway.start(tg)
                assert gateway.router is not None
                state["front"] = FrontDoor(
                    snapshot=gateway.snapshot,
                    auth=gateway.auth,
                    registry=gateway.registry,
                    router=gateway.router,
                    close_session=gateway.close_transport_session,
                    evidence_for=gateway.evidence_for,
                    end_request_evidence=gateway.end_request_evidence,
                    audit_isolation=gateway.audit_isolation,
                    serving=gateway.serving,
                )
                yield
            finally:
                await gateway.aclose()
                tg.cancel_scope.cancel()

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/mcp", _Mcp()),
            Route("/sessions/{session_id}/trace-claim", evidence.trace_claim),
            Route("/audit/export", evidence.export),
        ],
        lifespan=lifespan,
    )
