"""The active health prober's decisions (upstream/health.py); the real upstream is in tests/e2e."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import pytest

from bastion.errors import UpstreamUnavailable
from bastion.upstream.base import UpstreamHealth
from bastion.upstream.health import HealthSchedule, UpstreamProber

pytestmark = pytest.mark.anyio


@dataclass
class Knockable:
    """An upstream whose transport the test turns on and off."""

    name: str = "tools"
    reachable: bool = True
    connected: bool = True
    negotiated: bool = True
    on_transport_error: Callable[[], None] | None = None
    knocks: int = 0
    events: list[str] = field(default_factory=list)

    async def knock(self, timeout_s: float) -> None:
        self.knocks += 1
        if not self.reachable:
            raise UpstreamUnavailable("upstream tools: ConnectError")

    def mark_down(self, detail: str) -> None:
        self.connected = False
        self.events.append("down")

    def mark_up(self) -> None:
        self.connected = True
        self.events.append("up")

    def needs_negotiation(self) -> bool:
        return not self.negotiated

    def health(self) -> UpstreamHealth:
        return UpstreamHealth(self.name, self.name, "http", "session", self.connected, 0, None)


async def test_a_failed_knock_marks_down_and_the_next_answer_refreshes() -> None:
    """Down on the first failed knock; back up only with a refresh (tools listed again, sessions told)."""
    upstream = Knockable()
    refreshed: list[str] = []

    async def refresh(name: str) -> None:
        refreshed.append(name)

    prober = UpstreamProber(upstream, on_reconnected=refresh)
    upstream.reachable = False
    assert await prober.probe_once() is False
    assert upstream.connected is False and refreshed == []
    upstream.reachable = True
    assert await prober.probe_once() is True
    assert upstream.events == ["down", "up"] and refreshed == ["tools"]
    assert await prober.probe_once() is True and refreshed == ["tools"]  # up and known: no refresh


async def test_an_upstream_never_negotiated_is_connected_only_by_its_refresh() -> None:
    """Down at start: a knock that answers does not say "connected"; the refresh (negotiation) does."""
    upstream = Knockable(connected=False, negotiated=False)

    async def refresh_fails(name: str) -> None:
        raise RuntimeError("negotiation failed")

    prober = UpstreamProber(upstream, on_reconnected=refresh_fails)
    assert await prober.probe_once() is False
    assert upstream.connected is False and "up" not in upstream.events


async def test_a_transport_error_makes_the_prober_knock_at_once() -> None:
    """A call's transport error nudges the prober: it knocks before its (long) interval is up."""
    upstream = Knockable()

    async def refresh(name: str) -> None:
        pass

    prober = UpstreamProber(upstream, on_reconnected=refresh, schedule=HealthSchedule(interval_s=3600.0))
    assert upstream.on_transport_error is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(prober.run)
        upstream.reachable = False
        upstream.on_transport_error()
        with anyio.fail_after(10):
            while upstream.connected:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert upstream.knocks >= 1 and upstream.events[0] == "down"


def test_the_schedule_refuses_nonsense() -> None:
    """A backoff that shrinks, or a zero interval, is refused when the schedule is built."""
    with pytest.raises(ValueError):
        HealthSchedule(min_backoff_s=5.0, max_backoff_s=1.0)
    with pytest.raises(ValueError):
        HealthSchedule(interval_s=0)
