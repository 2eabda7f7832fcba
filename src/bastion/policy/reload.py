"""The snapshot in force, and how a new one replaces it (DESIGN section 8).

Owns :class:`SnapshotHolder`: it holds the one snapshot that decides calls,
and swaps it only for a snapshot that was fully built and validated. A reload
that fails leaves the last valid snapshot in force and is visible until a
valid one arrives: in :meth:`SnapshotHolder.state` (for ``/readyz``), in the
log, and in Prometheus metrics on the registry the gateway passes in (never
the global one). :meth:`SnapshotHolder.watch` optionally polls the file.

Readers take ``holder.current`` once per call, so one call is decided
entirely by one snapshot: the swap is a single reference assignment.
This module never reads the configuration itself (the loader does) and
never logs a setting's value (``ConfigError`` messages carry none).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Counter, Gauge

from bastion.errors import ConfigError
from bastion.policy.snapshot import Snapshot

__all__ = ["ReloadFailure", "SnapshotHolder"]

_log = logging.getLogger("bastion.policy")

Loader = Callable[[], Snapshot]


@dataclass(frozen=True)
class ReloadFailure:
    """Why the last reload was refused: the loader's message, when, and which file."""

    message: str
    at: datetime
    source: Path | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "message": self.message,
            "at": self.at.isoformat(),
            "source": str(self.source) if self.source is not None else None,
        }


class SnapshotHolder:
    """Holds the snapshot in force and replaces it atomically on a valid reload.

    ``registry`` receives the metrics ``bastion_policy_reloads_total{outcome}``,
    ``bastion_policy_reload_failing`` (1 while the last reload failed) and
    ``bastion_policy_last_success_timestamp_seconds``. ``clock`` gives wall time
    (seconds since the epoch) for failure records and the timestamp metric.
    """

    def __init__(
        self,
        initial: Snapshot,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._current = initial
        self._clock = clock
        self._failure: ReloadFailure | None = None
        # Reloads come from SIGHUP, the admin API and the watcher, maybe from worker threads.
        self._lock = threading.Lock()
        self._reloads = Counter(
            "bastion_policy_reloads",
            "Policy reloads, by outcome (success or failure).",
            ["outcome"],
            registry=registry,
        )
        self._failing = Gauge(
            "bastion_policy_reload_failing",
            "1 while the last reload failed and an older snapshot stays in force, else 0.",
            registry=registry,
        )
        self._last_success = Gauge(
            "bastion_policy_last_success_timestamp_seconds",
            "When the snapshot in force was activated (Unix time).",
            registry=registry,
        )
        for outcome in ("success", "failure"):
            self._reloads.labels(outcome=outcome)
        self._failing.set(0)
        self._last_success.set(clock())

    @property
    def current(self) -> Snapshot:
        """The snapshot in force. Read it once per call and decide the whole call with it."""
        return self._current

    def __call__(self) -> Snapshot:
        """Same as :attr:`current`, for code that takes a ``Callable[[], Snapshot]``."""
        return self._current

    @property
    def last_failure(self) -> ReloadFailure | None:
        """Why the last reload failed, or ``None`` when the last reload (if any) succeeded."""
        return self._failure

    def reload(self, loader: Loader, *, source: Path | None = None) -> Snapshot:
        """Build a snapshot with ``loader`` and put it in force only if that succeeds.

        ``source`` names the file in the failure record (default: the source
        of the snapshot in force). On failure the snapshot in force stays, the
        failure is recorded, logged and counted until a reload succeeds.

        Returns:
            The snapshot now in force (the new one).

        Raises:
            ConfigError: the new configuration is invalid; nothing changed except the failure record.
        """
        with self._lock:
            where = source if source is not None else self._current.source
            try:
                candidate = loader()
            except ConfigError as exc:
                self._record_failure(exc.message, where)
                raise
            # (1) Validation happened while building: a Snapshot that exists is valid.
            # (2) The swap: one reference assignment, so a reader sees the old or the new, never a mix.
            previous = self._current
            self._current = candidate
            self._failure = None
            self._reloads.labels(outcome="success").inc()
            self._failing.set(0)
            self._last_success.set(self._clock())
        _log.info(
            "policy snapshot %s in force (was %s)",
            candidate.version,
            previous.version,
            extra={"policy_version": candidate.version},
        )
        return candidate

    def state(self) -> dict[str, Any]:
        """For ``/readyz``: the version in force and why the last reload failed (``None`` if it did not)."""
        failure = self._failure
        return {
            "policy_version": self._current.version,
            "last_reload_error": failure.as_dict() if failure is not None else None,
        }

    async def watch(
        self,
        path: Path,
        loader: Loader,
        *,
        interval_s: float = 2.0,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Reload whenever the file at ``path`` changes; runs until cancelled.

        Start it with ``await task_group.start(holder.watch, path, loader)``:
        changes made after ``start`` returns are seen.

        Polls the file's modification time, size and inode every
        ``interval_s`` seconds (no extra dependency). A change that does not
        load is recorded like any failed reload; polling goes on, and the next
        change is tried again. A file that disappears is left alone: the
        snapshot in force stays, and its return is a change.
        """
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        seen = _signature(path)
        task_status.started()
        while True:
            await anyio.sleep(interval_s)
            now_seen = _signature(path)
            if now_seen == seen or now_seen is None:
                continue
            seen = now_seen
            # A refused reload is recorded, logged and counted by reload(); polling goes on.
            with contextlib.suppress(ConfigError):
                await anyio.to_thread.run_sync(lambda: self.reload(loader, source=path))

    def _record_failure(self, message: str, source: Path | None) -> None:
        self._failure = ReloadFailure(
            message=message,
            at=datetime.fromtimestamp(self._clock(), tz=UTC),
            source=source,
        )
        self._reloads.labels(outcome="failure").inc()
        self._failing.set(1)
        _log.warning(
            "policy reload refused, snapshot %s stays in force: %s",
            self._current.version,
            message,
            extra={"policy_version": self._current.version},
        )


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)
