"""What the rooms of one gateway read of it: the pieces built at ``__init__`` and at ``start``.

:class:`bastion.gateway.Gateway` satisfies :class:`ReplicaHost` structurally; a room never
imports the gateway (tests/unit/test_import_graph.py). The ``| None`` fields are set by
``Gateway.start``; a room reads them after start only.
"""

from __future__ import annotations

from typing import Protocol

import anyio
import anyio.abc

from bastion.audit.chain import CloseReason
from bastion.audit.scope import EvidenceScope
from bastion.audit.shared import SharedEvidence
from bastion.background import BackgroundTasks
from bastion.ids import AgentId
from bastion.methods import MethodRouter
from bastion.policy.reload import SnapshotHolder
from bastion.policy.snapshot import Snapshot
from bastion.replica.options import RuntimeOptions
from bastion.session.listeners import ListenerHub
from bastion.session.registry import SessionRegistry
from bastion.session.shared import SharedSessions
from bastion.session.state import TransportSession
from bastion.store.base import Store
from bastion.store.health import StoreHealth
from bastion.upstream.fleet import UpstreamFleet
from bastion.workers.attachment import AttachmentTracker
from bastion.workers.membership import WorkerMembership
from bastion.workers.runtimes import RuntimeRegistry

__all__ = ["ReplicaHost"]


class ReplicaHost(Protocol):
    policy: SnapshotHolder
    options: RuntimeOptions
    registry: SessionRegistry
    fleet: UpstreamFleet
    health: StoreHealth
    attachments: AttachmentTracker
    listeners: ListenerHub
    background: BackgroundTasks
    started: anyio.Event
    task_group: anyio.abc.TaskGroup | None
    store: Store | None
    membership: WorkerMembership | None
    shared_evidence: SharedEvidence | None
    shared: SharedSessions | None
    router: MethodRouter | None
    runtimes: RuntimeRegistry | None

    def snapshot(self) -> Snapshot: ...

    def evidence_for(self, agent: AgentId) -> EvidenceScope: ...

    async def close_evidence(self, scope: EvidenceScope, reason: CloseReason) -> None: ...

    async def close_transport_session(self, transport_session: TransportSession, reason: str) -> None: ...

    async def end_transport_session(self, transport_session: TransportSession, reason: str) -> None: ...

    async def revoked_elsewhere(self, agent_session_id: str) -> None: ...

    async def follow_policy_reload(self) -> None: ...
