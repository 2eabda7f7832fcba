"""``create_app``: the only wiring of Bastion's HTTP surface.

Routes: ``/mcp`` (the front door), ``/healthz`` (process alive),
``/readyz`` (configuration loaded, upstreams reachable, per-upstream detail),
``/metrics`` (Prometheus), ``/.well-known/bastion-keys.json`` (the signing keys
to pin, ``crypto/key_set.py``). The lifespan starts the gateway (upstreams
launched or connected, catalog built) and stops it (client sessions closed,
stdio upstreams terminated).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from bastion.admin.api import AdminGate, admin_routes
from bastion.audit.read_paths import EvidenceReadPaths
from bastion.auth.oauth import protected_resource_metadata
from bastion.auth.principal import Principal
from bastion.errors import BastionError, ConfigError
from bastion.front_route import MCP_PATH, McpFirst
from bastion.gateway import Gateway, RuntimeOptions
from bastion.gateway_metrics import GatewayMetrics
from bastion.policy.snapshot import Snapshot
from bastion.start_refusal import StartRefusal, start_refusal_line
from bastion.store.base import Store
from bastion.tracing import TraceContextAsgi
from bastion.transport.streamable_http import FrontDoor

__all__ = ["create_app"]

OPENMETRICS_CONTENT_TYPE = openmetrics.CONTENT_TYPE_LATEST
_openmetrics_latest: Callable[[CollectorRegistry], bytes] = openmetrics.generate_latest


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
        status = 200 if ready else 503
        # Per-upstream detail only for the admin credential: a DNS-rebinding page or any
        # client gets the bare verdict (issue #12).
        if not AdminGate(gateway.snapshot().auth.admin_token_sha256).admits(request):
            return JSONResponse({"ready": ready}, status_code=status)
        detail["policy_fleet"] = await gateway.fleet_policy()  # issue #10: who runs which snapshot
        return JSONResponse(detail, status_code=status)

    async def metrics(request: Request) -> Response:
        if "application/openmetrics-text" in request.headers.get("accept", ""):
            # OpenMetrics carries the exemplars (a call's trace id, when tracing is on).
            return Response(_openmetrics_latest(registry), media_type=OPENMETRICS_CONTENT_TYPE)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    class _Admin:
        # Built at start-up (it needs the store); until then, and without an admin credential, 403/404.
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            router = state.get("admin")
            if router is None:
                await JSONResponse({"error": {"reason": "starting"}}, status_code=503)(scope, receive, send)
                return
            await router(scope, receive, send)

    async def protected_resource(request: Request) -> Response:
        gateway: Gateway | None = state.get("gateway")
        auth = gateway.snapshot().auth if gateway is not None else None
        if auth is None or auth.oauth is None or not auth.resource_url:
            return JSONResponse({"error": {"reason": "not_configured"}}, status_code=404)
        return JSONResponse(protected_resource_metadata(auth.resource_url, [auth.oauth.issuer], ()))

    async def published_keys(request: Request) -> Response:
        # Public by design: verifiers pin these keys. Read per request: `bastion rotate-key` rewrites it.
        gateway: Gateway | None = state.get("gateway")
        if gateway is None or gateway.keyring is None:
            return JSONResponse({"error": {"reason": "starting"}}, status_code=503)
        document = await anyio.to_thread.run_sync(gateway.keyring.key_set)
        return JSONResponse(document, headers={"cache-control": "no-cache"})

    class _Mcp:
        # An ASGI app (not a function) so Starlette hands it the raw scope.
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await state["front"](scope, receive, send)

    def store() -> Store:
        gateway: Gateway = state["gateway"]
        assert gateway.store is not None
        return gateway.store

    async def authenticate(scope: Scope, authorization: str | None) -> Principal:
        gateway: Gateway = state["gateway"]
        return await gateway.authenticate(scope, authorization)

    def auditors() -> frozenset[str]:
        gateway: Gateway | None = state.get("gateway")
        configured = gateway.snapshot().auth.auditor_token_sha256 if gateway is not None else ()
        return auditor_token_hashes | frozenset(configured)

    evidence = EvidenceReadPaths(store, authenticate, auditors)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gateway = Gateway(snapshot, options, metrics=registry, clock=clock)
        GatewayMetrics(registry, gateway)
        state["gateway"] = app.state.gateway = gateway
        async with anyio.create_task_group() as tg:
            try:
                try:
                    await gateway.start(tg)
                except (BastionError, OSError) as exc:
                    # A refused start (held generation, unusable store or data directory) is one line,
                    # not a traceback: see StartRefusal and `bastion serve` (issue #11).
                    app.state.start_refusal = state["start_refusal"] = start_refusal_line(exc)
                    raise
                assert gateway.router is not None
                state["front"] = FrontDoor(
                    snapshot=gateway.snapshot,
                    authenticate=gateway.authenticate,
                    challenge=gateway.challenge,
                    registry=gateway.registry,
                    router=gateway.router,
                    close_session=gateway.end_transport_session,
                    evidence_for=gateway.evidence_for,
                    request_evidence_for=gateway.request_evidence_for,
                    end_request_evidence=gateway.end_request_evidence,
                    audit_isolation=gateway.audit_isolation,
                    serving=gateway.serving,
                    track_sessionless=gateway.sessionless_call,
                    client_notified=gateway.pass_on_client_notification,
                    cut_cause=gateway.cut_cause,
                    replicas=gateway.shared,
                )
                app.state.front = state["front"]  # its per-agent counts, for tests (issue #22)
                if gateway.tracing is not None:  # a client's traceparent header parents its calls
                    state["front"] = TraceContextAsgi(state["front"])
                state["admin"] = _admin_router(gateway)
                yield
            finally:
                await gateway.aclose()
                tg.cancel_scope.cancel()

    # /mcp goes straight to the front door once it exists (front_route.py); the route below
    # serves it only before start-up (a 500, as before) and under a root_path.
    return McpFirst(
        lambda: state.get("front"),
        middleware=[Middleware(StartRefusal, refusal=lambda: state.get("start_refusal"))],
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route(MCP_PATH, _Mcp()),
            Route("/admin/{rest:path}", _Admin(), methods=["GET", "POST"]),
            Route("/.well-known/oauth-protected-resource", protected_resource),
            Route("/.well-known/oauth-protected-resource/mcp", protected_resource),
            Route("/.well-known/bastion-keys.json", published_keys),
            Route("/sessions/{session_id}/trace-claim", evidence.trace_claim),
            Route("/audit/export", evidence.export),
            Route("/audit/execution", evidence.execution),
        ],
        lifespan=lifespan,
    )


def _admin_router(gateway: Gateway) -> Router:
    """``/admin/...``: agent sessions (revocation cuts live sessions here at once) and policy reload."""
    assert gateway.store is not None
    digest = gateway.snapshot().auth.admin_token_sha256
    gate = AdminGate(digest)

    async def reload(request: Request) -> Response:
        try:
            state = await gateway.reload_policy()
        except ConfigError as exc:
            return JSONResponse(
                {"error": {"reason": exc.reason.value, "message": exc.message}, **gateway.policy.state()},
                status_code=422,
            )
        return JSONResponse(state)

    routes = admin_routes(
        gateway.store,
        admin_token_sha256=digest,
        clock=lambda: datetime.now(UTC),
        on_revoke=gateway.end_agent_session,
        configured_digests=lambda: gateway.snapshot().credential_roles().keys(),
    )
    routes.append(Route("/admin/reload", gate.wrap(reload), methods=["POST"]))
    if gateway.call_path is not None:  # issue 27: step-up approvals, decided by approvers
        from bastion.admin.approvals import approval_routes

        routes += approval_routes(
            gateway.store, gate, approvers=lambda: gateway.snapshot().auth.approvers,
            waiters=gateway.call_path.step_up.waiters, clock=lambda: datetime.now(UTC),
        )  # fmt: skip
    from bastion.admin.workers import worker_routes

    routes += worker_routes(
        gateway.store,
        gate,
        clock=lambda: datetime.now(UTC),
        attachments=gateway.attachments,
        lease_s=gateway.options.lease_s,
        idle_timeout_s=lambda: gateway.snapshot().gateway.transport_session_idle_s,
    )
    from bastion.admin.pins import pin_routes

    routes += pin_routes(
        gateway.store, gate, clock=lambda: datetime.now(UTC), on_decided=gateway.pins_decided
    )
    return Router(routes=routes)
