"""Helpers shared by the worker tests (imported by basename; pytest puts this folder on sys.path)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
LEASE_S = 10.0
HOST = "host-under-test"


@dataclass
class Clock:
    """A settable clock: tests move time instead of waiting for it."""

    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now
