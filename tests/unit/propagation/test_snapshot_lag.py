"""How long a replica's policy snapshot has been behind its peers (issue #25: replica snapshot lag).

A real :class:`ReplicaFollower` is given the feed's ``policy_reloaded`` changes; its reload is a
version switch or a :class:`ConfigError`, and its clock is a
parameter, so the lag is read without sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bastion.errors import ConfigError
from bastion.ids import WorkerId
from bastion.propagation.follower import ReplicaFollower
from bastion.session.registry import SessionRegistry
from bastion.store.replicas import Change, ChangeKind

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class _Replica:
    """The version this replica runs, and what its file would reload to (or a ConfigError)."""

    def __init__(self) -> None:
        self.version = "v1"
        self.file: str | None = "v2"  # None: the file does not load
        self.now = T0

    async def reload(self) -> None:
        if self.file is None:
            raise ConfigError("policy file does not load")
        self.version = self.file

    def follower(self) -> ReplicaFollower:
        async def never(*_: object) -> None:
            raise AssertionError("not a policy change")

        return ReplicaFollower(
            store=None,  # type: ignore[arg-type]  # a policy change reads no store
            registry=SessionRegistry(idle_timeout_s=60, max_sessions=10),
            worker=lambda: WorkerId("w_here"),
            revoked=never,
            close_locally=never,
            reload_policy=self.reload,
            policy_version=lambda: self.version,
            now=lambda: self.now,
        )


def _reloaded(seq: int, version: str, at: datetime) -> Change:
    return Change(seq, ChangeKind.POLICY_RELOADED, version, None, WorkerId("w_peer"), at)


async def test_a_replica_that_cannot_follow_a_reload_accrues_lag_until_it_runs_that_version() -> None:
    """A peer's reload this replica's file cannot load: the lag grows from the reload's time, and
    is 0 again once this replica runs the peer's version."""
    replica = _Replica()
    follower = replica.follower()
    assert follower.snapshot_lag_s() == 0.0
    replica.file = None
    await follower.apply(_reloaded(1, "v2", T0))
    replica.now = T0 + timedelta(seconds=30)
    assert follower.snapshot_lag_s() == 30.0
    await follower.apply(_reloaded(2, "v3", T0 + timedelta(seconds=10)))  # behind since the first
    replica.now = T0 + timedelta(seconds=45)
    assert follower.snapshot_lag_s() == 45.0
    replica.file = "v3"
    await follower.apply(_reloaded(3, "v3", T0 + timedelta(seconds=46)))
    assert replica.version == "v3" and follower.snapshot_lag_s() == 0.0


async def test_a_reload_that_lands_on_another_version_is_behind_too() -> None:
    """The reload worked but this replica's file differs from the peer's: still behind, and in
    step again once this replica's own reload reaches the peer's version."""
    replica = _Replica()
    replica.file = "v1-local"
    follower = replica.follower()
    await follower.apply(_reloaded(1, "v2", T0))
    replica.now = T0 + timedelta(seconds=5)
    assert follower.snapshot_lag_s() == 5.0
    replica.version = "v2"  # an operator fixed the file and reloaded here
    assert follower.snapshot_lag_s() == 0.0


async def test_a_followed_reload_leaves_no_lag() -> None:
    """A reload followed to the peer's version: in step (its follow time goes to the histogram)."""
    replica = _Replica()
    follower = replica.follower()
    replica.now = T0 + timedelta(seconds=0.2)
    await follower.apply(_reloaded(1, "v2", T0))
    assert replica.version == "v2" and follower.snapshot_lag_s() == 0.0
    assert follower.policy_lag.total == pytest.approx(0.2)
