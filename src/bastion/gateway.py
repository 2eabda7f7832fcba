"""One gateway process: the snapshot in force, the store, the upstream fleet, the live transport sessions.

Composes the rooms of ``bastion/replica/`` (issue 26): start-up wiring, the live
sessions, revocation, policy following, the replica links, attachment records
and the readiness report, and owns the order of start-up and shutdown. It holds
no process-global state: two :class:`Gateway` objects in one process, on one
store, are two replicas.

Start-up order: open the store and the signing key; register this worker and
claim its generation (waiting out a live holder's lease); recover what a dead
predecessor left; start the upstreams; then serve.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import httpx
from prometheus_client import CollectorRegistry

from bastion.audit.chain import CloseReason
from bastion.audit.claim import PolicyInForce
from bastion.audit.entry import AuditEvent, Decision
from bastion.audit.recorder import EvidenceRecorder
from bastion.audit.scope import EvidenceScope
from bastion.audit.shared import SharedEvidence
from bastion.auth.agent_session import StoreBearerAuth, client_certificate_fingerprint
from bastion.auth.authenticator import Authenticator
from bastion.auth.bearer import StaticBearerAuth
from bastion.auth.oauth import OAuthVerifier, resource_metadata_url, www_authenticate
from bastion.auth.principal import Principal
from bastion.background import BackgroundTasks
from bastion.call import ToolCallPath
from bastion.call_telemetry import CallTelemetry
from bastion.crypto.keys import Keyring
from bastion.errors import BastionError, StoreError, WorkerSuperseded
from bastion.ids import AgentId
from bastion.methods import MethodRouter
from bastion.metrics import CallMetrics
from bastion.pinning.audit import PinAudit
from bastion.pinning.book import PinBook
from bastion.policy.decide import RateLimiter
from bastion.policy.reload import SnapshotHolder
from bastion.policy.shared_limits import StoreRateLimiter
from bastion.policy.snapshot import Snapshot
from bastion.propagation.feed import PollingChangeFeed
from bastion.propagation.follower import ReplicaFollower
from bastion.replica.attachment_links import AttachmentLinks
from bastion.replica.evidence_wiring import EvidenceWiring
from bastion.replica.links import start_replica_links
from bastion.replica.options import RuntimeOptions
from bastion.replica.peers import start_peer_takeover
from bastion.replica.policy_follow import PolicyFollowing
from bastion.replica.readiness import readiness
from bastion.replica.revocation import Revocations
from bastion.replica.sessions import LiveSessions
from bastion.replica.startup import (
    claim_gateway_store,
    open_gateway_store,
    recover_own_generation,
    warn_unsafe_options,
)
from bastion.session.listeners import ListenerHub
from bastion.session.registry import SessionRegistry
from bastion.session.replay import ReplayLimits
from bastion.session.shared import SharedSessions
from bastion.session.state import TransportSession
from bastion.store.base import AgentSessionRecord, Store
from bastion.store.health import StoreHealth
from bastion.store.pins import PinRecord
from bastion.tracing import Tracing, note_authentication
from bastion.upstream.fleet import UpstreamFleet
from bastion.workers.attachment import AttachmentTracker
from bastion.workers.late_write import LateWrite, record_late_write
from bastion.workers.membership import WorkerMembership
from bastion.workers.runtimes import RuntimeRegistry

__all__ = ["Gateway", "RuntimeOptions"]

logger = logging.getLogger(__name__)


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
        self.options = options
        self._static_auth = (snapshot.version, StaticBearerAuth(snapshot))
        self.limiter = RateLimiter()
        self.authenticator: Authenticator | None = None
        self._store_auth: StoreBearerAuth | None = None
        self._oauth_http: httpx.AsyncClient | None = None
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
        self.task_group: anyio.abc.TaskGroup | None = None
        # Loops that write to the store: ended before the store closes (issue #11 point 16).
        self.background = BackgroundTasks()
        # The rooms (bastion/replica/): each reads this gateway through ReplicaHost.
        self.evidence = EvidenceWiring(options, self.policy)
        self.attachment_links = AttachmentLinks(self)
        self.sessions = LiveSessions(self, persist_surface=self.attachment_links.persist_surface)
        self.revocations = Revocations(self)
        self.policy_following = PolicyFollowing(self)
        self.fleet = UpstreamFleet(
            snapshot,
            on_namespace_changed=self.broadcast_tools_changed,
            on_process_event=self._process_event,
            on_surface_changed=self.sessions.broadcast_surface_changed,
        )
        self.health = StoreHealth(refuse_when_degraded=options.refuse_when_store_degraded)
        # Per client session and namespace: connected (upstream up) and attached (in its surface).
        self.attachments = AttachmentTracker(
            reattach_session=self.attachment_links.reattach,
            health_probe=self.attachment_links.namespace_connected,
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
        return self.evidence.policy_in_force()

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start in order: store and key, membership (waiting out a live holder), evidence, recovery,
        the call path, authentication, the replica links, the upstreams, then the background loops."""
        self.task_group = task_group
        options = self.options
        # (1) the store (closed by aclose even when a later step refuses) and the signing key
        store = self.store = await open_gateway_store(options)
        self.keyring = keyring = await claim_gateway_store(store, options, self.policy.current)
        self.evidence.check_tee()
        warn_unsafe_options(options)
        # (2) this worker's generation, claimed (waiting out a live holder's lease)
        self.membership = WorkerMembership(
            store,
            options.generation,
            lease_s=options.lease_s,
            heartbeat_s=options.heartbeat_s,
            clock=lambda: datetime.now(UTC),
        )
        took_over = await self.membership.join(config_version=self.policy.current.version)
        # (3) the recorders: this worker's, and the chains sessionless requests share
        observe_write = self.telemetry.metrics.store_write_seconds.observe
        self.recorder = self.evidence.recorder(store, keyring, self.membership, observe_write=observe_write)
        self.shared_evidence = SharedEvidence(
            # the age bound is SharedEvidence's: nobody waits to rotate
            self.evidence.recorder(
                store, keyring, self.membership, max_age_s=math.inf, observe_write=observe_write
            ),
            max_age_s=options.sessionless_evidence_max_age_s,
            policy_version=lambda: self.policy.current.version,
            unsafe_disabled=options.unsafe_no_audit,
        )
        # (4) what a dead predecessor of this generation left
        if took_over:
            await recover_own_generation(
                store, self.recorder, self.membership, keyring, self.evidence, generation=options.generation
            )
        # (5) the call path and the method router
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
        self.registry.task_status = self.call_path.tasks.status_notified  # pushed task statuses
        self.router = MethodRouter(
            self.fleet,
            self.call_path,
            self.snapshot,
            telemetry=self.telemetry,
            on_surface=self.attachment_links.surface_listed,
            listeners=self.listeners,
        )
        # (6) authentication: static tokens, store credentials, OAuth
        oauth = self.policy.current.auth.oauth
        verifier = None
        if oauth is not None:
            self._oauth_http = httpx.AsyncClient(timeout=oauth.jwks_timeout_s, trust_env=False)
            verifier = OAuthVerifier(oauth, self._oauth_http)
        self._store_auth = StoreBearerAuth(store)
        self.authenticator = Authenticator(self.auth, self._store_auth, verifier)
        # (7) the links that make replicas interchangeable (issue #10)
        report_policy = self.policy_following.report_policy
        approval_decided = self.call_path.step_up.wake if self.call_path is not None else None
        links = start_replica_links(
            self,
            task_group,
            store,
            report_policy=report_policy,
            approval_decided=approval_decided,
            pins_changed=self.fleet.pins_changed,
        )
        self.shared, self.feed, self.follower = links.shared, links.feed, links.follower
        # (8) the upstreams, their runtimes recorded
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
        # (9) the loops: heartbeat, store health, idle sweep, shared evidence rotation, peer takeover
        self.background.start_soon(task_group, self.membership.heartbeat_forever, self.health.failed)
        self.background.start_soon(task_group, self.health.watch, self._probe_store, store.probe)
        self.background.start_soon(task_group, self.sessions.sweep_idle)
        self.background.start_soon(task_group, self.shared_evidence.sweep_forever)
        start_peer_takeover(self.background, task_group, store, keyring, options, self.evidence)
        self.started.set()

    async def _record_late_write(self, late: LateWrite) -> str:
        """Record what this superseded worker observed, under a fresh current writer (issue #11 point 5)."""
        assert self.store is not None and self.keyring is not None
        store, keyring, options = self.store, self.keyring, self.options

        def recorder_for(membership: WorkerMembership) -> EvidenceRecorder:
            return self.evidence.recorder(store, keyring, membership)

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
                await self.sessions.close_transport_session(transport_session, "shutdown")
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

    def end_request_evidence(self, scope: EvidenceScope) -> None:
        """A sessionless request ended (its entries were durable before its answer)."""
        assert self.shared_evidence is not None
        self.shared_evidence.leave(scope)

    async def close_evidence(self, scope: EvidenceScope, reason: CloseReason) -> None:
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
        await self.close_evidence(scope, CloseReason.REQUEST_END)

    # ------------------------------------------------------------------ the rooms, as app.py wires them

    async def close_transport_session(self, transport_session: TransportSession, reason: str) -> None:
        await self.sessions.close_transport_session(transport_session, reason)

    async def end_transport_session(self, transport_session: TransportSession, reason: str) -> None:
        await self.sessions.end_transport_session(transport_session, reason)

    def pass_on_client_notification(self, transport_session: TransportSession, method: str) -> None:
        self.sessions.pass_on_client_notification(transport_session, method)

    async def broadcast_tools_changed(self, namespace: str) -> None:
        await self.sessions.broadcast_tools_changed(namespace)

    def sessionless_call(
        self, principal: Principal, scope: anyio.CancelScope
    ) -> AbstractContextManager[None]:
        return self.revocations.sessionless_call(principal, scope)

    def cut_cause(self, principal: Principal) -> BastionError | None:
        return self.revocations.cut_cause(principal)

    async def end_agent_session(self, record: AgentSessionRecord) -> dict[str, Any]:
        return await self.revocations.end_agent_session(record)

    async def revoked_elsewhere(self, agent_session_id: str) -> None:
        await self.revocations.revoked_elsewhere(agent_session_id)

    async def pins_decided(self, pin: PinRecord, digest: str, previous: str, approve: bool) -> None:
        """An operator decided a changed definition at this replica: audit it, apply it here now (#27)."""
        await self.pin_audit.decided(pin, digest, previous, approve=approve)
        await self.fleet.pins_changed(pin.server)

    async def reload_policy(self) -> dict[str, Any]:
        return await self.policy_following.reload_policy()

    async def follow_policy_reload(self) -> None:
        await self.policy_following.follow_policy_reload()

    async def fleet_policy(self) -> dict[str, Any]:
        return await self.policy_following.fleet_policy()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return readiness(self)
