"""The links that make replicas interchangeable (issue #10): shared transport sessions, the
change feed this replica follows, the shared last-seen times, and the policy report.

Started once at start-up, on the gateway's background loops (ended before the store closes).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import anyio
import anyio.abc

from bastion.errors import StoreError
from bastion.propagation.feed import PollingChangeFeed, notifications_for
from bastion.propagation.follower import ReplicaFollower
from bastion.replica.host import ReplicaHost
from bastion.session.shared import SharedSessions
from bastion.store.base import Store

__all__ = ["ReplicaLinks", "start_replica_links"]

# How often this replica writes the shared last-seen time of the sessions it served (one batch).
_TOUCH_FLUSH_S = 1.0
# How long the change feed and terminated or idle session records are kept.
_CHANGE_RETENTION_S = 600.0


@dataclass(frozen=True)
class ReplicaLinks:
    shared: SharedSessions
    feed: PollingChangeFeed
    follower: ReplicaFollower


def start_replica_links(
    host: ReplicaHost,
    task_group: anyio.abc.TaskGroup,
    store: Store,
    *,
    report_policy: Callable[[], Awaitable[None]],
    approval_decided: Callable[[str], None] | None = None,
    pins_changed: Callable[[str], Awaitable[None]] | None = None,
) -> ReplicaLinks:
    """Shared transport sessions, the change feed, policy reports: what makes replicas interchangeable."""
    assert host.membership is not None
    membership = host.membership
    shared = SharedSessions(
        host.registry,
        store,
        membership.credentials,
        host.evidence_for,
        idle_timeout_s=lambda: host.policy.current.gateway.transport_session_idle_s,
    )
    feed = PollingChangeFeed(store)
    follower = ReplicaFollower(
        store,
        host.registry,
        worker=lambda: membership.worker,
        revoked=host.revoked_elsewhere,
        close_locally=host.close_transport_session,
        reload_policy=host.follow_policy_reload,
        policy_version=lambda: host.policy.current.version,
        approval_decided=approval_decided,
        pins_changed=pins_changed,
    )

    async def follow() -> None:
        with contextlib.suppress(StoreError):
            await feed.start()
        await feed.follow(follower.apply)

    host.background.start_soon(task_group, follow)
    listen = notifications_for(store)
    if listen is not None:
        host.background.start_soon(task_group, listen, feed.nudge)
    host.background.start_soon(task_group, _flush_touches, host, shared, store)
    host.background.start_soon(task_group, report_policy)
    return ReplicaLinks(shared, feed, follower)


async def _flush_touches(host: ReplicaHost, shared: SharedSessions, store: Store) -> None:
    last_prune = time.monotonic()
    while True:
        await anyio.sleep(_TOUCH_FLUSH_S)
        if host.membership is None or host.membership.superseded:
            return
        await shared.flush_touches()
        if time.monotonic() - last_prune > _CHANGE_RETENTION_S / 10:
            last_prune = time.monotonic()
            with contextlib.suppress(StoreError):
                await store.prune_changes(datetime.now(UTC) - timedelta(seconds=_CHANGE_RETENTION_S))
