"""Active health of HTTP upstreams (DESIGN section 6, issue #11 points 1 and 2).

Health that is only passive fails open: a dead upstream would look connected
until some call to it happened to fail, and mutating calls would be admitted
meanwhile. So each HTTP upstream has a prober that knocks (``ping``) on an
interval while the upstream is up, at once when a call saw a transport error,
and with exponential backoff while it is down. The first failed knock marks
the upstream down (``/readyz`` 503, the attachment gate refuses mutating calls
with ``required_namespace_not_connected``); the first answer after an outage,
or after an upstream that was down at start comes up, runs ``on_reconnected``
(the fleet negotiates the era if it was never learned, lists the tools again
and tells the client sessions), so nothing waits for an operator or a restart.

Owns: the probe schedule. Never decides a call's fate itself and never kills
anything; the upstream keeps the connection facts (``health()``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from bastion.errors import UpstreamError
from bastion.upstream.base import UpstreamHealth

__all__ = ["HealthSchedule", "Probeable", "UpstreamProber"]

logger = logging.getLogger(__name__)


class Probeable(Protocol):
    """What the prober needs of an upstream (``upstream.streamable_http.HttpUpstream``)."""

    name: str
    on_transport_error: Callable[[], None] | None

    async def knock(self, timeout_s: float) -> None: ...

    def mark_down(self, detail: str) -> None: ...

    def mark_up(self) -> None: ...

    def needs_negotiation(self) -> bool: ...

    def health(self) -> UpstreamHealth: ...


@dataclass(frozen=True, slots=True)
class HealthSchedule:
    """When to knock: every ``interval_s`` while up; backoff doubling from ``min_backoff_s`` while down."""

    interval_s: float = 1.0
    min_backoff_s: float = 0.25
    max_backoff_s: float = 5.0
    timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.min_backoff_s <= self.max_backoff_s or self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("health schedule: need 0 < min_backoff_s <= max_backoff_s, positive interval")


class UpstreamProber:
    """Knocks one upstream on a schedule and on demand; marks it down or up, and heals it."""

    def __init__(
        self,
        upstream: Probeable,
        *,
        on_reconnected: Callable[[str], Awaitable[None]],
        schedule: HealthSchedule | None = None,
    ) -> None:
        self._upstream = upstream
        self._on_reconnected = on_reconnected
        self._schedule = schedule or HealthSchedule()
        self._wake = anyio.Event()
        upstream.on_transport_error = self.nudge
        #: Times the upstream came back after an outage this prober saw (``metrics.py``: not its
        #: first connection, which is not a reconnect).
        self.reconnects = 0
        self._outage = False  # marked down after having been up

    def nudge(self) -> None:
        """Knock now (a call just saw a transport error), not at the next interval."""
        self._wake.set()

    async def run(self) -> None:
        """Probe forever; cancelled with the gateway's task group."""
        schedule = self._schedule
        backoff = schedule.min_backoff_s
        while True:
            up = self._upstream.health().connected
            with anyio.move_on_after(schedule.interval_s if up else backoff):
                await self._wake.wait()
            self._wake = anyio.Event()
            if await self.probe_once():
                backoff = schedule.min_backoff_s
            else:
                backoff = min(backoff * 2, schedule.max_backoff_s)

    async def probe_once(self) -> bool:
        """One knock, and what follows from it; returns whether the upstream is up afterwards."""
        upstream = self._upstream
        was_up = upstream.health().connected
        try:
            await upstream.knock(self._schedule.timeout_s)
        except UpstreamError as exc:
            if was_up:
                logger.warning("upstream down", extra={"upstream": upstream.name, "detail": exc.message})
                self._outage = True
            upstream.mark_down(exc.message)
            return False
        if was_up and not upstream.needs_negotiation():
            return True
        # (1) Back after an outage, or (2) up for the first time since start: learn the era if it was
        #     never learned, list the tools again and tell the sessions. Connected only once that worked.
        if not upstream.needs_negotiation():
            upstream.mark_up()
        try:
            await self._on_reconnected(upstream.name)
        except Exception:  # a failed refresh leaves the upstream as the refresh left it; knock again
            logger.exception("upstream reconnect refresh failed", extra={"upstream": upstream.name})
        healed = upstream.health().connected
        if healed:
            logger.warning("upstream connected", extra={"upstream": upstream.name})
            if self._outage:
                self.reconnects, self._outage = self.reconnects + 1, False
        return healed
