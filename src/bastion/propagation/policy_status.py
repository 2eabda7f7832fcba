"""Which policy snapshot each replica runs, and which replica is behind (DESIGN section 8; #10).

Each gateway reports the version it runs (and its last reload error) at start
and after every reload attempt. A reload at one replica is announced on the
change feed and followed by the others (``propagation/follower.py``), so the
fleet converges within the feed's bound when every replica reads the same file.

*Behind*, as ``/readyz`` and ``bastion workers`` show it: a live gateway
worker that runs a version other than the fleet's newest (the version of the
most recent report that carried no reload error), or whose last reload
failed. The rule needs no order on versions (they are digests): the newest is
what some replica applied last.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bastion.errors import StoreError
from bastion.ids import Epoch, WorkerId
from bastion.store.base import Store
from bastion.store.replicas import PolicyReport

__all__ = ["FleetPolicy", "fleet_policy", "read_fleet_policy", "report_policy"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FleetPolicy:
    """The live gateway workers' reports, the newest version among them, and who is behind."""

    newest: str | None
    reports: Mapping[WorkerId, PolicyReport]
    behind: frozenset[WorkerId]

    def version_of(self, worker: WorkerId | None) -> str | None:
        report = self.reports.get(worker) if worker is not None else None
        return None if report is None else report.policy_version

    def to_json(self) -> dict[str, Any]:
        return {
            "newest": self.newest,
            "behind": sorted(self.behind),
            "replicas": {
                worker: {"version": r.policy_version, "reload_error": r.reload_error}
                for worker, r in sorted(self.reports.items())
            },
        }


def fleet_policy(reports: Iterable[PolicyReport], live: Iterable[WorkerId]) -> FleetPolicy:
    """Decide who is behind among the ``live`` workers' reports (pure; see the module docstring)."""
    alive = set(live)
    current = {r.worker_id: r for r in reports if r.worker_id in alive}
    applied = [r for r in current.values() if r.reload_error is None]
    newest = max(applied, key=lambda r: (r.reported_at, r.worker_id)).policy_version if applied else None
    behind = frozenset(
        worker
        for worker, report in current.items()
        if report.reload_error is not None or (newest is not None and report.policy_version != newest)
    )
    return FleetPolicy(newest, current, behind)


async def read_fleet_policy(store: Store, *, now: datetime, lease_s: float) -> FleetPolicy:
    """:func:`fleet_policy` over the stored reports and live gateway workers; raises :class:`StoreError`."""
    workers = await store.list_workers()
    live = [w.worker_id for w in workers if w.role == "gateway" and w.is_live(now, lease_s)]
    return fleet_policy(await store.list_policy_reports(), live)


async def report_policy(
    store: Store,
    credentials: tuple[WorkerId, Epoch],
    state: Mapping[str, Any],
    *,
    now: datetime,
) -> None:
    """Record what ``SnapshotHolder.state()`` says this replica runs; a failure is logged, never raised."""
    writer, epoch = credentials
    error = state.get("last_reload_error")
    try:
        await store.report_policy(
            str(state.get("policy_version")),
            None if error is None else json.dumps(error, sort_keys=True, default=str),
            now,
            writer=writer,
            epoch=epoch,
        )
    except StoreError as exc:
        logger.warning("policy version not reported: %s", exc.message)
