"""One gateway process: the snapshot in force, the store, the upstream fleet, the live transport sessions.

Owns start-up and shutdown order, closing a transport session (its upstream
sessions and its evidence session with it), expiring idle sessions, fanning
``tools/list_changed`` out, and the readiness report. It holds no
process-global state: two :class:`Gateway` objects in one process, on one
store, are two replicas.

Start-up order: open the store and the signing key; register this worker and
claim its generation (waiting out a live holder's lease); recover what a dead
predecessor left; start the upstreams; then serve.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
from prometheus_client import CollectorRegistry

from bastion import __version__
from bastion.audit.chain import CloseReason
from bastion.audit.claim import ClaimProfile, PolicyInForce
from bastion.audit.entry import AuditEvent, Decision
from bastion.audit.recorder import EvidenceRecorder
from bastion.audit.scope import EvidenceScope
from bastion.audit.shared import SharedEvidence
from bastion.audit.tee import DEFAULT_TSM_REPORT_ROOT, ConfigfsTsm, no_attestation
from bastion.auth.agent_session import StoreBearerAuth, client_certificate_fingerprint
from bastion.auth.authenticator import Authenticator
from bastion.auth.bearer import StaticBearerAuth
from bastion.auth.oauth import OAuthVerifier, resource_metadata_url, www_authenticate
from bastion.auth.principal import Principal
from bastion.auth.roles import check_store_roles
from bastion.background import BackgroundTasks
from bastion.call import ToolCallPath
from bastion.call_telemetry import CallTelemetry
from bastion.crypto.keys import Keyring
from bastion.errors import AgentSessionRevoked, BastionError, ConfigError, StoreError, WorkerSuperseded
from bastion.ids import AgentId, WorkerId
from bastion.methods import MethodRouter
from bastion.metrics import CallMetrics
from bastion.pinning.audit import PinAudit
from bastion.pinning.book import PinBook
from bastion.policy.decide import RateLimiter, SurfaceKind, surface_reachable, visible_tools
from bastion.policy.digest import snapshot_digest
from bastion.policy.load import load_snapshot
from bastion.policy.reload import SnapshotHolder
from bastion.policy.shared_limits import StoreRateLimiter
from bastion.policy.snapshot import ProcessScope, Snapshot
from bastion.propagation.feed import PollingChangeFeed, notifications_for
from bastion.propagation.follower import ReplicaFollower
from bastion.propagation.policy_status import read_fleet_policy, report_policy
from bastion.session.listeners import (
    PROMPTS_LIST_CHANGED,
    RESOURCES_LIST_CHANGED,
    TOOLS_LIST_CHANGED,
    ListenerHub,
)
from bastion.session.registry import SessionRegistry
from bastion.session.replay import ReplayLimits
from bastion.session.shared import SharedSessions
from bastion.session.state import TransportSession
from bastion.store.base import AgentSessionRecord, Store
from bastion.store.health import StoreHealth
from bastion.store.ownership import check_store_file, claim_store
from bastion.store.pins import PinRecord
from bastion.store.replicas import ChangeKind
from bastion.store.select import SQLITE_FILE, open_store
from bastion.tracing import Tracing, note_authentication
from bastion.transport.jsonrpc import dumps
from bastion.upstream.fleet import UpstreamFleet
from bastion.upstream.stdio import StdioUpstream
from bastion.workers.attachment import (
    AttachmentTracker,
    SurfaceChange,
    persist_surface_change,
    transport_session_ref,
)
from bastion.workers.late_write import LateWrite, record_late_write
from bastion.workers.membership import WorkerMembership
from bastion.workers.recovery import recover_generation
from bastion.workers.runtimes import RuntimeRegistry

__all__ = ["Gateway", "RuntimeOptions"]

logger = logging.getLogger(__name__)

_SWEEP_INTERVAL_S = 5.0
# How long closing a session waits for its cancelled calls to record their outcome.
_CANCELLED_CALLS_GRACE_S = 10.0
# A revocation, termination or policy reload made at another replica reaches this one within this
# bound: the change feed is read every POLL_INTERVAL_S (0.25 s), or at once on a notification (#10).
REVOCATION_SYNC_S = 1.0
# How often this replica writes the shared last-seen time of the sessions it served (one batch).
_TOUCH_FLUSH_S = 1.0
# How long the change feed and terminated or idle session records are kept.
_CHANGE_RETENTION_S = 600.0


@dataclass(frozen=True)
class RuntimeOptions:
    """Process-level settings that are not policy: where state lives and how this worker is fenced."""

    data_dir: Path
    # A PostgreSQL URL (``store/select.py``); ``None``: the SQLite file in ``data_dir``.
    store_url: str | None = None
    generation: str = "gateway-0"
    lease_s: float = 10.0
    heartbeat_s: float = 2.0
    evidence_max_entries: int = 10_000
    evidence_max_age_s: float = 3600.0
    # The age bound of the evidence sessions sessionless requests share (``audit/shared.py``).
    sessionless_evidence_max_age_s: float = 60.0
    trust_domain: str = "bastion.local"
    issuer: str = "https://bastion.local/"
    tsm_root: Path = DEFAULT_TSM_REPORT_ROOT
    refuse_when_store_degraded: bool = True
    # Benchmarks only: turns the audit chain off (`bastion serve --unsafe-no-audit`); warned at start.
    unsafe_no_audit: bool = False
    store_factory: Callable[[Store], Store] | None = None  # tests wrap the store (FaultyStore)
    # `bastion serve --discard-store-and-start-empty`: a used data directory's missing or empty
    # SQLite file starts a new, empty store instead of refusing the start (store/ownership.py).
    discard_store: bool = False


def _build_digest() -> str:
    """``sha256:`` over the installed package's source files: the build these claims come from."""
    digest = hashlib.sha256(__version__.encode())
    root = resources.files("bastion")
    for path in sorted(Path(str(root)).rglob("*.py")):
        digest.update(path.relative_to(Path(str(root))).as_posix().encode())
        digest.update(path.read_bytes())
    return "sha256:" + digest.hexdigest()


class Gateway:
    """Everything one gateway process serves with."""

    def __init__(
        self,
        snapshot: Snapshot,
        options: RuntimeOptions,
        *,
        metrics: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = SnapshotHolder(snapshot, registry=metrics)
        # Per-call metrics and access lines (issue #25), on this gateway's own registry.
        self.tracing = Tracing.from_environment()  # off unless OTEL_* configures an exporter
        self.telemetry = CallTelemetry(
            CallMetrics(metrics), lambda: self.policy.current.gateway, tracing=self.tracing
        )
        self._policy_in_force: tuple[Snapshot, PolicyInForce] | None = None
        self.options = options
        self._static_auth = (snapshot.version, StaticBearerAuth(snapshot))
        self.limiter = RateLimiter()
        self.authenticator: Authenticator | None = None
        self._store_auth: StoreBearerAuth | None = None
        self._oauth_http: httpx.AsyncClient | None = None
        # Sessionless requests in flight, by agent session, so a revocation can cancel them too.
        self._sessionless_in_flight: dict[str, set[anyio.CancelScope]] = {}
        self._applied_revocations: set[str] = set()
        # Agent sessions whose live calls this gateway cut: those calls are answered with a typed error.
        self._cut_agent_sessions: set[str] = set()
        self.registry = SessionRegistry(
            idle_timeout_s=snapshot.gateway.transport_session_idle_s,
            max_sessions=snapshot.gateway.max_transport_sessions,
            max_sessions_per_agent=snapshot.gateway.max_transport_sessions_per_agent,
            clock=clock,
            replay_limits=ReplayLimits(
                events_per_stream=snapshot.gateway.sse_replay_events,
                bytes_per_stream=snapshot.gateway.sse_replay_bytes,
                streams_per_session=snapshot.gateway.sse_replay_streams,
            ),
        )
        self._runtime_hook: Callable[[str, Any], None] | None = None
        self.runtimes: RuntimeRegistry | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        # Loops that write to the store: ended before the store closes (issue #11 point 16).
        self.background = BackgroundTasks()
        self.fleet = UpstreamFleet(
            snapshot,
            on_namespace_changed=self.broadcast_tools_changed,
            on_process_event=self._process_event,
            on_surface_changed=self.broadcast_surface_changed,
        )
        self.health = StoreHealth(refuse_when_degraded=options.refuse_when_store_degraded)
        # Per client session and namespace: connected (upstream up) and attached (in its surface).
        self.attachments = AttachmentTracker(
            reattach_session=self._reattach, health_probe=self._namespace_connected
        )
        self.started = anyio.Event()
        self.store: Store | None = None
        self.keyring: Keyring | None = None
        self.membership: WorkerMembership | None = None
        self.recorder: EvidenceRecorder | None = None
        # The chains this gateway's sessionless requests share, per agent session (never global).
        self.shared_evidence: SharedEvidence | None = None
        self.call_path: ToolCallPath | None = None
        self.router: MethodRouter | None = None
        # Issue #10: transport sessions as store records, and the change feed this replica follows.
        self.shared: SharedSessions | None = None
        self.follower: ReplicaFollower | None = None
        self.feed: PollingChangeFeed | None = None
        # Open subscriptions/listen streams (sessionless clients' list_changed notifications).
        self.listeners = ListenerHub()
        self._tsm = ConfigfsTsm(options.tsm_root)
        self._tsm_reason: str | None = None
        self._profile = ClaimProfile(
            trust_domain=options.trust_domain, issuer=options.issuer, build_digest=_build_digest()
        )

    def snapshot(self) -> Snapshot:
        """The snapshot in force now (a call reads it once and keeps it)."""
        return self.policy.current

    def auth(self) -> StaticBearerAuth:
        snapshot = self.policy.current
        version, _ = self._static_auth
        if version != snapshot.version:
            self._static_auth = (snapshot.version, StaticBearerAuth(snapshot))
        return self._static_auth[1]

    def challenge(self, presented: bool = True) -> str:
        """The ``WWW-Authenticate`` value of a 401 (RFC 9728 metadata when OAuth is configured).

        ``error="invalid_token"`` only when a credential was presented (RFC 6750 section 3.1).
        """
        auth = self.policy.current.auth
        if auth.oauth is not None and auth.resource_url:
            error = "invalid_token" if presented else None
            return www_authenticate(resource_metadata_url(auth.resource_url), error=error)
        return 'Bearer realm="bastion"'

    async def authenticate(self, scope: Mapping[str, Any], authorization: str | None) -> Principal:
        """The principal of one HTTP request: a bearer credential, or a client certificate (mTLS).
        Traced, its times become the authentication step of the request's call span (tracing.py)."""
        if self.tracing is None:
            return await self._authenticate(scope, authorization)
        started = time.time_ns()
        principal = await self._authenticate(scope, authorization)
        note_authentication(started)
        return principal

    async def _authenticate(self, scope: Mapping[str, Any], authorization: str | None) -> Principal:
        assert self.authenticator is not None and self._store_auth is not None
        auth = self.policy.current.auth
        if authorization is None:
            fingerprint = client_certificate_fingerprint(
                scope, trusted_header=auth.mtls_fingerprint_header, trusted_proxies=auth.mtls_trusted_proxies
            )
            if fingerprint is not None:
                return await self._store_auth.principal_for_certificate(fingerprint, datetime.now(UTC))
        return await self.authenticator.authenticate(authorization, scope.get("query_string", b""))

    def policy_in_force(self) -> PolicyInForce:
        """The snapshot in force, committed to by the digest of its compiled form (``policy/digest.py``)."""
        snapshot = self.policy.current
        if self._policy_in_force is None or self._policy_in_force[0] is not snapshot:
            digest = PolicyInForce(bundle_hash=snapshot_digest(snapshot), version=snapshot.version)
            self._policy_in_force = (snapshot, digest)
        return self._policy_in_force[1]

    def _attest(self, chain_root: str) -> dict[str, Any]:
        if self._tsm_reason is not None:
            return no_attestation(self._tsm_reason)
        return self._tsm.bind_chain_root(chain_root)

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group
        options = self.options
        options.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if options.store_url is None:  # issue #23: a used data directory never starts a fresh file
            check_store_file(options.data_dir / SQLITE_FILE, options.data_dir, discard=options.discard_store)
        store: Store = await open_store(options.store_url, options.data_dir)
        if options.store_factory is not None:
            store = options.store_factory(store)
        self.store = store
        # One credential, one role: a configured token that is also a store credential is refused.
        await check_store_roles(self.policy.current, store)
        self.keyring = Keyring.open(options.data_dir)
        await claim_store(
            store,
            active_key=self.keyring.key_id,
            known_keys=(key.key_id for key in self.keyring.verifying_keys()),
            data_dir=options.data_dir,
            shared=options.store_url is not None,
            now=datetime.now(UTC),
        )
        if not options.tsm_root.is_dir():
            self._tsm_reason = f"configfs-tsm is not available at {options.tsm_root}"
            logger.warning(
                "TEE binding unavailable; evidence sessions record attestation none",
                extra={
                    "reason": self._tsm_reason,
                },
            )
        if options.unsafe_no_audit:
            logger.warning(
                "UNSAFE: the audit chain is off (--unsafe-no-audit); nothing is recorded or claimed"
            )
        self.membership = WorkerMembership(
            store,
            options.generation,
            lease_s=options.lease_s,
            heartbeat_s=options.heartbeat_s,
            clock=lambda: datetime.now(UTC),
        )
        took_over = await self.membership.join(config_version=self.policy.current.version)
        self.recorder = EvidenceRecorder(
            store,
            self.keyring,
            self.membership,
            attest=self._attest,
            profile=self._profile,
            policy=self.policy_in_force,
            max_entries=options.evidence_max_entries,
            max_age_s=options.evidence_max_age_s,
            observe_write=self.telemetry.metrics.store_write_seconds.observe,
        )
        self.shared_evidence = SharedEvidence(
            EvidenceRecorder(
                store,
                self.keyring,
                self.membership,
                attest=self._attest,
                profile=self._profile,
                policy=self.policy_in_force,
                max_entries=options.evidence_max_entries,
                max_age_s=math.inf,  # the age bound is SharedEvidence's: nobody waits to rotate
                observe_write=self.telemetry.metrics.store_write_seconds.observe,
            ),
            max_age_s=options.sessionless_evidence_max_age_s,
            policy_version=lambda: self.policy.current.version,
            unsafe_disabled=options.unsafe_no_audit,
        )
        if took_over:
            changes, closed = await recover_generation(
                store,
                self.recorder,
                self.membership,
                self.keyring,
                profile=self._profile,
                policy=self.policy_in_force(),
            )
            logger.warning(
                "took over generation",
                extra={
                    "generation": options.generation,
                    "executions": len(changes),
                    "chains_closed": len(closed),
                },
            )
        self.call_path = ToolCallPath(
            self.fleet,
            self.snapshot,
            store=store,
            membership=self.membership,
            health=self.health,
            limiter=self.limiter,
            attachments=self.attachments,
            shared_limits=StoreRateLimiter(store, lambda: datetime.now(UTC)),
            on_late_write=self._record_late_write,
            telemetry=self.telemetry,
        )
        self.router = MethodRouter(
            self.fleet,
            self.call_path,
            self.snapshot,
            telemetry=self.telemetry,
            on_surface=self._surface_listed,
            listeners=self.listeners,
        )
        oauth = self.policy.current.auth.oauth
        verifier = None
        if oauth is not None:
            self._oauth_http = httpx.AsyncClient(timeout=oauth.jwks_timeout_s, trust_env=False)
            verifier = OAuthVerifier(oauth, self._oauth_http)
        self._store_auth = StoreBearerAuth(store)
        self.authenticator = Authenticator(self.auth, self._store_auth, verifier)
        self._start_replica_links(task_group, store)
        self.runtimes = RuntimeRegistry(
            store,
            clock=lambda: datetime.now(UTC),
            lease_s=options.lease_s,
            heartbeat_s=options.heartbeat_s,
            owner=options.generation,
            launched_by=self.membership.worker,
            fence=self.membership.check_current,  # runtime heartbeats end with this gateway's epoch
            credentials=self.membership.credentials,  # an owned process's owner record (issue 22)
        )
        self._runtime_hook = self.runtimes.process_hook(self.policy.current.version)
        task_group.start_soon(self.runtimes.run)  # ended by runtimes.settle() at shutdown
        # Issue 27: every listing admitted against its pins; lock files read now (refused: no start).
        self.pin_audit = PinAudit(self.evidence_for, self.health.failed)
        self.fleet.pins = PinBook.for_servers(
            lambda: self.policy.current.servers, store, on_change=self.pin_audit.changed
        )
        await self.fleet.start(task_group)
        self.background.start_soon(task_group, self.membership.heartbeat_forever, self.health.failed)
        self.background.start_soon(task_group, self.health.watch, self._probe_store, store.probe)
        self.background.start_soon(task_group, self._sweep_idle)
        self.background.start_soon(task_group, self.shared_evidence.sweep_forever)
        # --- issue #5 (workers/takeover.py): peer takeover. As a survivor, take over a peer's
        # generation whose holder is not live (expired heartbeat, or a PID known dead on this host)
        # and that left work unsettled; recover it under a fresh recovery worker and a strictly
        # higher epoch. Never this gateway's own generation. One block; imports local on purpose.
        from bastion.workers.liveness import pid_alive
        from bastion.workers.takeover import watch_peers

        peer_keyring = self.keyring
        assert peer_keyring is not None

        def peer_membership(generation: str) -> WorkerMembership:
            return WorkerMembership(
                store,
                generation,
                lease_s=options.lease_s,
                heartbeat_s=options.heartbeat_s,
                clock=lambda: datetime.now(UTC),
            )

        async def recover_peer(peer: WorkerMembership) -> None:
            peer_recorder = EvidenceRecorder(
                store,
                peer_keyring,
                peer,
                attest=self._attest,
                profile=self._profile,
                policy=self.policy_in_force,
                max_entries=options.evidence_max_entries,
                max_age_s=options.evidence_max_age_s,
            )
            await recover_generation(
                store, peer_recorder, peer, peer_keyring, profile=self._profile, policy=self.policy_in_force()
            )

        async def watch_for_peers() -> None:
            await watch_peers(
                store,
                peer_membership,
                recover_peer,
                interval_s=options.lease_s / 2,
                lease_s=options.lease_s,
                clock=lambda: datetime.now(UTC),
                pid_alive=pid_alive,
                own_generation=options.generation,
            )

        self.background.start_soon(task_group, watch_for_peers)
        # --- end issue #5 block
        self.started.set()

    async def _record_late_write(self, late: LateWrite) -> str:
        """Record what this superseded worker observed, under a fresh current writer (issue #11 point 5)."""
        assert self.store is not None and self.keyring is not None
        store, keyring, options = self.store, self.keyring, self.options

        def recorder_for(membership: WorkerMembership) -> EvidenceRecorder:
            return EvidenceRecorder(
                store,
                keyring,
                membership,
                attest=self._attest,
                profile=self._profile,
                policy=self.policy_in_force,
                max_entries=options.evidence_max_entries,
                max_age_s=options.evidence_max_age_s,
            )

        return await record_late_write(
            store,
            late,
            recorder_for=recorder_for,
            policy_version=self.policy.current.version,
            lease_s=options.lease_s,
            heartbeat_s=options.heartbeat_s,
            clock=lambda: datetime.now(UTC),
        )

    def _process_event(self, kind: str, upstream: Any) -> None:
        if self._runtime_hook is not None:
            self._runtime_hook(kind, upstream)

    async def _probe_store(self) -> None:
        assert self.store is not None and self.membership is not None and self.membership.worker is not None
        await self.store.heartbeat(self.membership.worker, datetime.now(UTC))

    async def aclose(self) -> None:
        """Shut down in an order where nothing writes after the store closed (issue #11 point 16).

        (1) client sessions (their evidence closed, claims issued; listen streams ended); (2) the
        upstreams (processes stopped); (3) their exits recorded; (4) every background loop ended;
        (5) the store.
        """
        self.listeners.close_all()
        with anyio.CancelScope(shield=True):
            for transport_session in list(self.registry):
                await self.close_transport_session(transport_session, "shutdown")
            if self.shared_evidence is not None:
                try:
                    await self.shared_evidence.close_all()
                except StoreError as exc:  # left open: closed with a claim by whoever recovers them
                    logger.warning("shared evidence sessions not closed: %s", exc.message)
            await self.fleet.aclose()
            if self.runtimes is not None:
                await self.runtimes.settle()
            await self.background.cancel_and_wait()
            if self._oauth_http is not None:
                await self._oauth_http.aclose()
            if self.store is not None:
                await self.store.aclose()
            if self.tracing is not None:
                await anyio.to_thread.run_sync(self.tracing.shutdown)  # the spans still batched

    def serving(self) -> None:
        """Raises while this worker must not answer (superseded by a newer epoch)."""
        if self.membership is not None and self.membership.superseded:
            raise WorkerSuperseded()

    # ------------------------------------------------------------------ evidence

    def evidence_for(self, agent: AgentId) -> EvidenceScope:
        assert self.recorder is not None
        return EvidenceScope(
            self.recorder,
            agent,
            policy_version=self.policy.current.version,
            unsafe_disabled=self.options.unsafe_no_audit,
        )

    def request_evidence_for(self, principal: Principal) -> EvidenceScope:
        """The evidence scope a sessionless request joins: its agent session's shared chain here."""
        assert self.shared_evidence is not None
        return self.shared_evidence.join(principal)

    async def end_request_evidence(self, scope: EvidenceScope) -> None:
        """A sessionless request ended (its entries were durable before its answer)."""
        assert self.shared_evidence is not None
        self.shared_evidence.leave(scope)

    async def _close_evidence(self, scope: EvidenceScope, reason: CloseReason) -> None:
        try:
            await scope.close(reason)
        except StoreError as exc:
            self.health.failed(exc, owed=lambda: scope.close(reason))

    async def audit_isolation(self, agent: AgentId, cause: str, reason: str = "session_not_found") -> None:
        scope = self.evidence_for(agent)
        try:
            await scope.record(
                AuditEvent.ISOLATION_REFUSED,
                decision=Decision.DENY.value,
                reason=reason,
                detail={"cause": cause},
            )
        except StoreError as exc:
            self.health.failed(exc)
        await self._close_evidence(scope, CloseReason.REQUEST_END)

    # ------------------------------------------------------------------ attachment (DESIGN section 6)

    def _namespace_connected(self, namespace: str) -> bool | None:
        for upstream in self.fleet.upstreams.values():
            if upstream.namespace == namespace:
                return upstream.health().connected
        return None

    def _surface_listed(self, transport_session: TransportSession, namespaces: frozenset[str]) -> None:
        change = self.attachments.surface_listed(transport_session_ref(transport_session.id), namespaces)
        if (change.attached or change.detached) and self._task_group is not None:
            # Ownership records (which live session uses which worker) are written off the call path.
            self._task_group.start_soon(self._persist_surface, change)

    async def _persist_surface(self, change: SurfaceChange) -> None:
        if self.store is None or self.membership is None or self.membership.superseded:
            return
        if self.background.closed:
            return  # shutting down: this worker's liveness ends, and with it what its records prove
        worker, epoch = self.membership.credentials()

        def worker_for(namespace: str) -> WorkerId | None:
            for name, upstream in self.fleet.upstreams.items():
                if upstream.namespace == namespace:
                    if isinstance(upstream, StdioUpstream) and upstream.scope is not ProcessScope.SHARED:
                        return None  # its processes' owners are recorded as they start (runtimes.py)
                    runtime = self.runtimes.current(name) if self.runtimes is not None else None
                    return runtime.worker if runtime is not None else worker
            return None

        try:
            await persist_surface_change(
                self.store, change, worker_for=worker_for, writer=worker, epoch=epoch, now=datetime.now(UTC)
            )
        except StoreError as exc:
            logger.warning("attachment records not written: %s", exc.message)
        except Exception:  # a background record must never take the gateway down
            logger.exception("attachment records not written")

    async def _reattach(self, ref: str, namespace: str) -> frozenset[str]:
        """The sanctioned re-attach: re-initialize that session's upstream session, refresh the surface."""
        transport_session = next((t for t in self.registry if transport_session_ref(t.id) == ref), None)
        server = next((n for n, u in self.fleet.upstreams.items() if u.namespace == namespace), None)
        owner = self.attachments.owner_of(ref)
        if transport_session is None and server is not None and isinstance(owner, Principal):
            # A sessionless agent has no upstream session to re-initialize: refresh the namespace's
            # tools and list them for that agent (issue #11 point 2).
            await self.fleet.refresh_server(server)
            visible = visible_tools(self.snapshot(), owner, self.fleet.catalog.values())
            return frozenset(entry.namespace for entry in visible)
        if transport_session is None or server is None:
            raise RuntimeError("unknown transport session or namespace")
        stale = transport_session.upstream_sessions.get(server)
        if stale is not None:
            transport_session.upstream_sessions.drop(server, stale)
            await self.fleet.upstreams[server].close_session(stale)
        await self.fleet.refresh_server(server)
        visible = visible_tools(self.snapshot(), transport_session.principal, self.fleet.catalog.values())
        surface = frozenset(entry.namespace for entry in visible)
        transport_session.surface_namespaces = surface
        transport_session.server_stream.publish(
            dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        )
        return surface

    # ------------------------------------------------------------------ revocation

    @contextlib.contextmanager
    def sessionless_call(self, principal: Principal, scope: anyio.CancelScope) -> Iterator[None]:
        """Track a sessionless request so revoking its agent session cancels it."""
        key = principal.agent_session_id
        if key is None:
            yield
            return
        self._sessionless_in_flight.setdefault(key, set()).add(scope)
        try:
            yield
        finally:
            scopes = self._sessionless_in_flight.get(key)
            if scopes is not None:
                scopes.discard(scope)
                if not scopes:
                    del self._sessionless_in_flight[key]

    def cut_cause(self, principal: Principal) -> BastionError | None:
        """Why the gateway cancelled this principal's calls (its agent session was revoked), or ``None``."""
        if principal.agent_session_id in self._cut_agent_sessions:
            return AgentSessionRevoked("Agent session revoked: this call was cut")
        return None

    async def end_agent_session(self, record: AgentSessionRecord) -> dict[str, Any]:
        """Apply a revocation here, at once: one audited operation that ends everything of that agent session.

        Its next request on any transport session is refused by the authenticator;
        this cancels its in-flight calls (an execution in flight ends
        ``outcome_unknown`` unless the upstream already answered), closes its
        upstream sessions and its evidence sessions (claims issued), and writes
        one ``revocation`` audit entry listing what it ended. Idempotent.
        """
        self._cut_agent_sessions.add(record.agent_session_id)
        # Marked before the first await: the change feed may report this same revocation while it is
        # being applied here, and must not apply (and audit) it a second time.
        self._applied_revocations.add(record.agent_session_id)
        ended = [t for t in self.registry if t.principal.agent_session_id == record.agent_session_id]
        in_flight = sum(len(t.in_flight) for t in ended)
        evidence_closed: list[str] = []
        for transport_session in ended:
            if transport_session.evidence.session_id is not None:
                evidence_closed.append(transport_session.evidence.session_id)
            await self.close_transport_session(transport_session, CloseReason.REVOCATION.value)
        sessionless = self._sessionless_in_flight.pop(record.agent_session_id, set())
        for cancel_scope in sessionless:
            cancel_scope.cancel()
        with anyio.CancelScope(shield=True):  # its own stdio processes stop with it (issue 22)
            await self.fleet.agent_session_ended(record.agent, record.agent_session_id)
        if self.shared_evidence is not None:
            # Its sessionless requests' shared chain closes too, claim issued (after their outcomes).
            try:
                evidence_closed += await self.shared_evidence.close_agent_session(record.agent_session_id)
            except StoreError as exc:
                self.health.failed(exc)
        summary = {
            "agent_session_id": record.agent_session_id,
            "transport_sessions_closed": len(ended),
            "calls_cancelled": in_flight + len(sessionless),
            "evidence_sessions_closed": evidence_closed,
        }
        # Always audited, even when nothing was live here: the revocation itself is evidence.
        evidence = self.evidence_for(AgentId(record.agent))
        try:
            await evidence.record(
                AuditEvent.REVOCATION,
                decision=Decision.DENY.value,
                reason="agent_session_revoked",
                detail={
                    **summary,
                    "revoked_by": record.revoked_by,
                    "revoke_reason": record.revoke_reason,
                },
            )
            await evidence.close(CloseReason.REVOCATION)
        except StoreError as exc:
            self.health.failed(exc)
        logger.warning("agent session revoked: live sessions ended", extra=summary)
        return summary

    async def pins_decided(self, pin: PinRecord, digest: str, previous: str, approve: bool) -> None:
        """An operator decided a changed definition at this replica: audit it, apply it here now (#27)."""
        await self.pin_audit.decided(pin, digest, previous, approve=approve)
        await self.fleet.pins_changed(pin.server)

    async def revoked_elsewhere(self, agent_session_id: str) -> None:
        """A revocation made anywhere (the change feed said so): end it here if this replica serves it."""
        assert self.store is not None
        if agent_session_id in self._applied_revocations:
            return
        live = {t.principal.agent_session_id for t in self.registry} | set(self._sessionless_in_flight)
        if self.shared_evidence is not None:
            live |= self.shared_evidence.agent_sessions()
        if agent_session_id not in live:
            return
        record = await self.store.get_agent_session(agent_session_id)
        if record is not None and record.revoked_at is not None:
            await self.end_agent_session(record)

    # ------------------------------------------------------------------ replicas (issue #10)

    def _start_replica_links(self, task_group: anyio.abc.TaskGroup, store: Store) -> None:
        """Shared transport sessions, the change feed, policy reports: what makes replicas interchangeable."""
        assert self.membership is not None
        membership = self.membership
        self.shared = SharedSessions(
            self.registry,
            store,
            membership.credentials,
            self.evidence_for,
            idle_timeout_s=lambda: self.policy.current.gateway.transport_session_idle_s,
        )
        self.feed = PollingChangeFeed(store)
        self.follower = ReplicaFollower(
            store,
            self.registry,
            worker=lambda: membership.worker,
            revoked=self.revoked_elsewhere,
            close_locally=self.close_transport_session,
            reload_policy=self.follow_policy_reload,
            policy_version=lambda: self.policy.current.version,
            pins_changed=self.fleet.pins_changed,
        )
        follower = self.follower
        feed = self.feed

        async def follow() -> None:
            with contextlib.suppress(StoreError):
                await feed.start()
            await feed.follow(follower.apply)

        self.background.start_soon(task_group, follow)
        listen = notifications_for(store)
        if listen is not None:
            self.background.start_soon(task_group, listen, feed.nudge)
        self.background.start_soon(task_group, self._flush_touches)
        self.background.start_soon(task_group, self._report_policy)

    async def _flush_touches(self) -> None:
        assert self.shared is not None and self.store is not None
        last_prune = time.monotonic()
        while True:
            await anyio.sleep(_TOUCH_FLUSH_S)
            if self.membership is None or self.membership.superseded:
                return
            await self.shared.flush_touches()
            if time.monotonic() - last_prune > _CHANGE_RETENTION_S / 10:
                last_prune = time.monotonic()
                with contextlib.suppress(StoreError):
                    await self.store.prune_changes(datetime.now(UTC) - timedelta(seconds=_CHANGE_RETENTION_S))

    async def _report_policy(self) -> None:
        if self.store is not None and self.membership is not None and not self.membership.superseded:
            await report_policy(
                self.store, self.membership.credentials(), self.policy.state(), now=datetime.now(UTC)
            )

    async def fleet_policy(self) -> dict[str, Any]:
        """For ``/readyz``: the version each live replica runs, the newest, and who is behind."""
        if self.store is None:
            return {}
        try:
            fleet = await read_fleet_policy(self.store, now=datetime.now(UTC), lease_s=self.options.lease_s)
        except StoreError as exc:
            return {"error": exc.message}
        worker = self.membership.worker if self.membership is not None else None
        return {**fleet.to_json(), "this_replica_behind": worker in fleet.behind}

    async def follow_policy_reload(self) -> None:
        """Another replica reloaded its policy: reload this one's file too (not announced again)."""
        try:
            await self._reload_policy_file()
        finally:
            await self._report_policy()

    async def end_transport_session(self, transport_session: TransportSession, reason: str) -> None:
        """End a client session at every replica (DELETE, shared idle expiry), then close it here."""
        if self.shared is not None:
            shared = self.shared
            try:
                await shared.terminate(transport_session, reason)
            except StoreError as exc:
                # Owed: the termination is written when the store is back; until then this replica
                # has forgotten the session, and others still serve it (the client asked to end it).
                self.health.failed(exc, owed=lambda: shared.terminate(transport_session, reason))
        await self.close_transport_session(transport_session, reason)

    # ------------------------------------------------------------------ policy reload

    async def _reload_policy_file(self) -> dict[str, Any]:
        """Validate the configuration file again and swap it in atomically, or keep the last valid one.

        Upstream servers are fixed for the life of the process: a file whose
        ``servers`` differ is refused (restart to apply), and the snapshot in
        force stays.
        """
        current = self.policy.current
        if current.source is None:
            raise ConfigError("this gateway runs a built-in configuration; there is no file to reload")

        refused: ConfigError | None = None
        try:
            loaded = load_snapshot(current.source)
            if self.store is not None:
                await check_store_roles(loaded, self.store)
        except ConfigError as exc:
            refused = exc

        def loader() -> Snapshot:
            if refused is not None:
                raise refused
            candidate = loaded
            if dict(candidate.servers) != dict(current.servers):
                raise ConfigError(f"{current.source}: servers changed; restart the gateway to apply them")
            if candidate.auth != current.auth:
                # Credentials checked at start (OAuth verifier, admin token) must not half-change.
                raise ConfigError(f"{current.source}: [auth] changed; restart the gateway to apply it")
            if {a.name for a in candidate.agents if a.anonymous} != {
                a.name for a in current.agents if a.anonymous
            }:
                # Only `bastion serve` knows the bind, so only a start may admit an anonymous agent.
                raise ConfigError(
                    f"{current.source}: the anonymous agent changed; restart the gateway to apply it"
                )
            return candidate

        self.policy.reload(loader, source=current.source)
        return self.policy.state()

    async def reload_policy(self) -> dict[str, Any]:
        """Reload here (SIGHUP, ``POST /admin/reload``), report it, and announce it to the other replicas.

        Raises :class:`ConfigError` (reported too) when the file cannot be used.
        """
        try:
            state = await self._reload_policy_file()
        finally:
            await self._report_policy()
        if self.store is not None and self.membership is not None and self.membership.worker is not None:
            try:
                await self.store.publish_change(
                    ChangeKind.POLICY_RELOADED,
                    str(state["policy_version"]),
                    None,
                    origin=self.membership.worker,
                )
            except StoreError as exc:
                logger.warning("policy reload not announced to other replicas: %s", exc.message)
        return state

    # ------------------------------------------------------------------ sessions

    async def close_transport_session(self, transport_session: TransportSession, reason: str) -> None:
        """End one client session: cancel its calls, close only its upstream sessions, issue its claim.

        The evidence session closes only after the cancelled calls have recorded their
        outcome (``outcome_unknown`` when sent), so no entry is left without a chain.
        """
        cancelled = self.registry.remove(transport_session)
        if self.router is not None:  # its resource subscriptions end with it (issue 9)
            await self.router.subscriptions.session_closed(transport_session)
        change = self.attachments.session_closed(transport_session_ref(transport_session.id))
        if change.detached and self._task_group is not None:
            self._task_group.start_soon(self._persist_surface, change)
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCELLED_CALLS_GRACE_S):
            for call in cancelled:
                await call.done.wait()
        for server in transport_session.upstream_sessions.servers():
            upstream_session = transport_session.upstream_sessions.get(server)
            upstream = self.fleet.upstreams.get(server)
            if upstream is not None and upstream_session is not None:
                with anyio.move_on_after(5, shield=True):
                    await upstream.close_session(upstream_session)
        transport_session.upstream_sessions.take_all()
        with anyio.CancelScope(shield=True):
            await self._close_evidence(transport_session.evidence, CloseReason(reason))
        logger.info("transport session closed", extra={"reason": reason, "agent": transport_session.agent})

    def pass_on_client_notification(self, transport_session: TransportSession, method: str) -> None:
        """A session-era client's ``roots/list_changed`` reaches its own upstream sessions, and no other."""
        if self._task_group is None:
            return
        for server in transport_session.upstream_sessions.servers():
            upstream_session = transport_session.upstream_sessions.get(server)
            upstream = self.fleet.upstreams.get(server)
            if upstream is not None and upstream_session is not None:
                self._task_group.start_soon(upstream.notify_session, upstream_session, method)

    async def broadcast_tools_changed(self, namespace: str) -> None:
        """Tell the client sessions that see ``namespace`` (their grants cover one of its tools)."""
        payload = dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        snapshot = self.snapshot()
        entries = [e for e in self.fleet.catalog.values() if e.namespace == namespace]
        for transport_session in self.registry:
            if visible_tools(snapshot, transport_session.principal, entries):
                transport_session.server_stream.publish(payload)
        self.listeners.publish(
            TOOLS_LIST_CHANGED,
            "notifications/tools/list_changed",
            lambda principal: bool(visible_tools(snapshot, principal, entries)),
        )

    async def broadcast_surface_changed(self, server: str, method: str) -> None:
        """Tell the client sessions (and listen streams) whose grants reach that server's prompts or
        resources that the list changed (issue 9)."""
        prompts = method == "notifications/prompts/list_changed"
        kind = SurfaceKind.PROMPT if prompts else SurfaceKind.RESOURCE
        snapshot = self.snapshot()
        namespace = self.fleet.upstreams[server].namespace

        def sees(principal: Principal) -> bool:
            return surface_reachable(snapshot, principal, kind, server, namespace)

        payload = dumps({"jsonrpc": "2.0", "method": method})
        for transport_session in self.registry:
            if sees(transport_session.principal):
                transport_session.server_stream.publish(payload)
        self.listeners.publish(PROMPTS_LIST_CHANGED if prompts else RESOURCES_LIST_CHANGED, method, sees)

    async def _sweep_idle(self) -> None:
        while True:
            await anyio.sleep(_SWEEP_INTERVAL_S)
            if self.shared is not None:
                await self.shared.flush_touches()
            for transport_session in self.registry.expired():
                # Idle here; ended everywhere only if no other replica served it within the timeout.
                if self.shared is not None and await self.shared.idle_everywhere(transport_session):
                    await self.end_transport_session(transport_session, "idle_expiry")
                else:
                    await self.close_transport_session(transport_session, "idle_expiry")

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        upstreams = [
            {
                "name": h.name,
                "namespace": h.namespace,
                "kind": h.kind,
                "era": h.era,
                "connected": h.connected,
                "tools": h.tools,
                "detail": h.detail,
            }
            for h in self.fleet.health()
        ]
        superseded = self.membership is not None and self.membership.superseded
        ready = (
            self.started.is_set()
            and all(u["connected"] for u in upstreams)
            and not self.health.degraded
            and not superseded
        )
        policy_state = self.policy.state()
        return ready, {
            "ready": ready,
            "policy_version": self.policy.current.version,
            "policy_reload_error": policy_state.get("last_reload_error"),
            "transport_sessions": len(self.registry),
            "upstreams": upstreams,
            "skipped_tools": list(self.fleet.skipped_tools),
            "tool_collisions": [c.describe() for c in self.fleet.tool_collisions],
            "store": {
                "degraded": self.health.degraded,
                "reason": self.health.degraded_reason,
                "cause": self.health.degraded_cause,
                "audit_owed": len(self.health.deferred),
            },
            "worker": {
                "id": self.membership.worker if self.membership else None,
                "generation": self.options.generation,
                "epoch": self.membership.epoch if self.membership else None,
                "superseded": superseded,
            },
        }
