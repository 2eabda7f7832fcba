"""The readiness report of one replica (``/readyz``): ready only when started, every upstream
connected, the store not degraded and this worker not superseded."""

from __future__ import annotations

from typing import Any

from bastion.replica.host import ReplicaHost

__all__ = ["readiness"]


def readiness(host: ReplicaHost) -> tuple[bool, dict[str, Any]]:
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
        for h in host.fleet.health()
    ]
    membership = host.membership
    superseded = membership is not None and membership.superseded
    ready = (
        host.started.is_set()
        and all(u["connected"] for u in upstreams)
        and not host.health.degraded
        and not superseded
    )
    policy_state = host.policy.state()
    return ready, {
        "ready": ready,
        "policy_version": host.policy.current.version,
        "policy_reload_error": policy_state.get("last_reload_error"),
        "transport_sessions": len(host.registry),
        "upstreams": upstreams,
        "skipped_tools": list(host.fleet.skipped_tools),
        "tool_collisions": [c.describe() for c in host.fleet.tool_collisions],
        "store": {
            "degraded": host.health.degraded,
            "reason": host.health.degraded_reason,
            "cause": host.health.degraded_cause,
            "audit_owed": len(host.health.deferred),
        },
        "worker": {
            "id": membership.worker if membership else None,
            "generation": host.options.generation,
            "epoch": membership.epoch if membership else None,
            "superseded": superseded,
        },
    }
