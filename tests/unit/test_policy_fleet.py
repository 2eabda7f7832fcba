"""Which replica is behind on policy (propagation/policy_status.py, issue #10)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bastion.ids import WorkerId
from bastion.propagation.policy_status import fleet_policy
from bastion.store.replicas import PolicyReport

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
A, B, C = WorkerId("gw-a"), WorkerId("gw-b"), WorkerId("gw-c")


def report(worker: WorkerId, version: str, seconds: int, error: str | None = None) -> PolicyReport:
    return PolicyReport(worker, version, error, T0 + timedelta(seconds=seconds))


def test_a_replica_that_did_not_follow_the_newest_reload_is_behind() -> None:
    """The newest version is the last one applied; a replica still on another version is behind."""
    fleet = fleet_policy([report(A, "v1", 0), report(B, "v2", 5), report(C, "v2", 6)], [A, B, C])
    assert fleet.newest == "v2" and fleet.behind == {A}
    assert fleet.to_json()["behind"] == ["gw-a"]


def test_a_failed_reload_marks_its_replica_behind_without_moving_the_newest() -> None:
    """A report with a reload error is behind and never decides the newest version."""
    fleet = fleet_policy([report(A, "v2", 0), report(B, "v1", 9, error="bad toml")], [A, B])
    assert fleet.newest == "v2" and fleet.behind == {B}


def test_only_live_workers_count() -> None:
    """A dead worker's report neither decides the newest nor shows as behind."""
    fleet = fleet_policy([report(A, "v1", 0), report(B, "v9", 9)], [A])
    assert fleet.newest == "v1" and fleet.behind == frozenset() and set(fleet.reports) == {A}
