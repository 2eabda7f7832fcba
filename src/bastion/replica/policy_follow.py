"""Policy reload at one replica, and following the reloads of the others (issue #10).

Owns validating the configuration file again and swapping it in (or keeping the last valid
snapshot), reporting the version this replica runs, announcing a reload to the fleet, and the
fleet's view for ``/readyz``. Upstream servers, ``[auth]`` and the anonymous agent are fixed
for the life of the process: a file that changes them is refused.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from bastion.auth.roles import check_store_roles
from bastion.errors import ConfigError, StoreError
from bastion.policy.load import load_snapshot
from bastion.policy.snapshot import Snapshot
from bastion.propagation.policy_status import read_fleet_policy, report_policy
from bastion.replica.host import ReplicaHost
from bastion.store.replicas import ChangeKind

__all__ = ["PolicyFollowing"]

logger = logging.getLogger("bastion.gateway")


class PolicyFollowing:
    """Reloads this replica's policy file, reports it, and announces it to the other replicas."""

    def __init__(self, host: ReplicaHost) -> None:
        self._host = host

    async def report_policy(self) -> None:
        host = self._host
        if host.store is not None and host.membership is not None and not host.membership.superseded:
            await report_policy(
                host.store, host.membership.credentials(), host.policy.state(), now=datetime.now(UTC)
            )

    async def fleet_policy(self) -> dict[str, Any]:
        """For ``/readyz``: the version each live replica runs, the newest, and who is behind."""
        host = self._host
        if host.store is None:
            return {}
        try:
            fleet = await read_fleet_policy(host.store, now=datetime.now(UTC), lease_s=host.options.lease_s)
        except StoreError as exc:
            return {"error": exc.message}
        worker = host.membership.worker if host.membership is not None else None
        return {**fleet.to_json(), "this_replica_behind": worker in fleet.behind}

    async def follow_policy_reload(self) -> None:
        """Another replica reloaded its policy: reload this one's file too (not announced again)."""
        try:
            await self.reload_policy_file()
        finally:
            await self.report_policy()

    async def reload_policy_file(self) -> dict[str, Any]:
        """Validate the configuration file again and swap it in atomically, or keep the last valid one.

        Upstream servers are fixed for the life of the process: a file whose
        ``servers`` differ is refused (restart to apply), and the snapshot in
        force stays.
        """
        host = self._host
        current = host.policy.current
        if current.source is None:
            raise ConfigError("this gateway runs a built-in configuration; there is no file to reload")

        refused: ConfigError | None = None
        try:
            loaded = load_snapshot(current.source)
            if host.store is not None:
                await check_store_roles(loaded, host.store)
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

        host.policy.reload(loader, source=current.source)
        return host.policy.state()

    async def reload_policy(self) -> dict[str, Any]:
        """Reload here (SIGHUP, ``POST /admin/reload``), report it, and announce it to the other replicas.

        Raises :class:`ConfigError` (reported too) when the file cannot be used.
        """
        host = self._host
        try:
            state = await self.reload_policy_file()
        finally:
            await self.report_policy()
        if host.store is not None and host.membership is not None and host.membership.worker is not None:
            try:
                await host.store.publish_change(
                    ChangeKind.POLICY_RELOADED,
                    str(state["policy_version"]),
                    None,
                    origin=host.membership.worker,
                )
            except StoreError as exc:
                logger.warning("policy reload not announced to other replicas: %s", exc.message)
        return state
