"""Which of resources, prompts and completions a principal is offered (issue 9).

A capability is advertised (at ``initialize`` and in ``server/discover``) only when some
upstream that declared it could show this principal something under its grants; a
client is never told of a surface it cannot use. Pure: reads the fleet's learned
upstream capabilities and the snapshot.
"""

from __future__ import annotations

from typing import Any

from bastion.auth.principal import Principal
from bastion.policy.decide import SurfaceKind, surface_reachable
from bastion.policy.snapshot import Snapshot
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["surface_capabilities"]


def surface_capabilities(fleet: UpstreamFleet, snapshot: Snapshot, principal: Principal) -> dict[str, Any]:
    """``resources``, ``prompts`` and ``completions`` entries for this principal's capabilities."""
    reachable: set[SurfaceKind] = set()
    completions = subscribe = False
    for server, upstream in fleet.upstreams.items():
        here = {
            kind
            for kind, capability in ((SurfaceKind.RESOURCE, "resources"), (SurfaceKind.PROMPT, "prompts"))
            if fleet.offers(server, capability)
            and surface_reachable(snapshot, principal, kind, server, upstream.namespace)
        }
        reachable |= here
        subscribe = subscribe or (SurfaceKind.RESOURCE in here and fleet.offers_subscribe(server))
        completions = completions or (bool(here) and fleet.offers(server, "completions"))
    offered: dict[str, Any] = {}
    if SurfaceKind.RESOURCE in reachable:
        offered["resources"] = {"listChanged": True, **({"subscribe": True} if subscribe else {})}
    if SurfaceKind.PROMPT in reachable:
        offered["prompts"] = {"listChanged": True}
    if completions:
        offered["completions"] = {}
    return offered
