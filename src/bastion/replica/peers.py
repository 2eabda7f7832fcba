"""Issue #5 at start-up: as a survivor, take over a peer's generation whose holder is not live.

A holder is not live when its heartbeat expired or its PID is known dead on this host, and it
left work unsettled; its generation is recovered under a fresh recovery worker and a strictly
higher epoch (``workers/takeover.py``). Never this gateway's own generation.
"""

from __future__ import annotations

from datetime import UTC, datetime

import anyio.abc

from bastion.background import BackgroundTasks
from bastion.crypto.keys import Keyring
from bastion.replica.evidence_wiring import EvidenceWiring
from bastion.replica.options import RuntimeOptions
from bastion.store.base import Store
from bastion.workers.membership import WorkerMembership
from bastion.workers.recovery import recover_generation

__all__ = ["start_peer_takeover"]


def start_peer_takeover(
    background: BackgroundTasks,
    task_group: anyio.abc.TaskGroup,
    store: Store,
    keyring: Keyring,
    options: RuntimeOptions,
    evidence: EvidenceWiring,
) -> None:
    """Start watching the peers' generations, on this gateway's background loops."""
    # Imports local on purpose: the one edge from start-up to peer takeover (test_import_graph).
    from bastion.workers.liveness import pid_alive
    from bastion.workers.takeover import watch_peers

    def peer_membership(generation: str) -> WorkerMembership:
        return WorkerMembership(
            store,
            generation,
            lease_s=options.lease_s,
            heartbeat_s=options.heartbeat_s,
            clock=lambda: datetime.now(UTC),
        )

    async def recover_peer(peer: WorkerMembership) -> None:
        peer_recorder = evidence.recorder(store, keyring, peer)
        await recover_generation(
            store, peer_recorder, peer, keyring, profile=evidence.profile, policy=evidence.policy_in_force()
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

    background.start_soon(task_group, watch_for_peers)
