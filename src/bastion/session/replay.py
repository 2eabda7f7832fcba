"""SSE event streams of one transport session, kept for ``Last-Event-ID`` resumption (DESIGN section 5).

Session era only (2025-03-26 to 2025-11-25 transports, "Resumability and
Redelivery"): every SSE stream the gateway opens for a session, its GET stream
and each POST response that went to SSE, numbers its events with ids that name
the stream (``<stream key>-<n>``). A client that lost a stream sends a GET with
``Last-Event-ID``; the gateway replays exactly the later events of that stream
and continues it live (a response stream ends with its response).

Streams are found only through their own session's :class:`SessionStreams`, so
another session's event id names nothing here and is refused exactly as an
unknown one. Everything is bounded (:class:`ReplayLimits`): events and bytes per
stream, response streams per session (the oldest finished ones go first). An
id whose successors are no longer all held is refused too: a replay is exact
or it does not happen. The sessionless era (2026-07-28) has no resumption.
"""

from __future__ import annotations

import itertools
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass

import anyio

from bastion.errors import LastEventIdUnknown

__all__ = ["EventStream", "ReplayLimits", "SessionStreams"]


@dataclass(frozen=True)
class ReplayLimits:
    """Bounds on what one session keeps for replay (``[gateway] sse_replay_*``, checked there)."""

    events_per_stream: int = 128
    bytes_per_stream: int = 65_536
    streams_per_session: int = 8


class EventStream:
    """One SSE stream: numbered events, a bounded replay buffer, one reader at a time.

    A new reader replaces the previous one (a client reconnecting after a drop
    must not be locked out by its own half-dead connection); the old reader
    sees :meth:`is_current` turn false and writes nothing more.
    """

    def __init__(self, limits: ReplayLimits) -> None:
        self.key = secrets.token_hex(8)
        self._limits = limits
        self._events: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self._numbers = itertools.count(1)
        self._last = 0
        self._dropped_through = 0  # every event numbered up to here is no longer held
        self._changed = anyio.Event()
        self._reader = 0
        self.finished = False

    def event_id(self, number: int) -> str:
        return f"{self.key}-{number}"

    def publish(self, payload: bytes) -> int:
        """Append one event; returns its number. The oldest events go past the bounds."""
        number = next(self._numbers)
        self._last = number
        self._events.append((number, payload))
        self._bytes += len(payload)
        while len(self._events) > 1 and (
            len(self._events) > self._limits.events_per_stream or self._bytes > self._limits.bytes_per_stream
        ):
            dropped, data = self._events.popleft()
            self._bytes -= len(data)
            self._dropped_through = dropped
        self._wake()
        return number

    def finish(self) -> None:
        """No event follows (a response stream sent its response, or its request was cancelled)."""
        self.finished = True
        self._wake()

    def last_number(self) -> int:
        return self._last

    def after(self, number: int) -> list[tuple[int, bytes]]:
        """Every event after ``number``, exactly.

        Raises:
            LastEventIdUnknown: ``number`` was never sent on this stream, or some of its
                successors are no longer held.
        """
        if number < self._dropped_through or number > self._last:
            raise LastEventIdUnknown(cause="not_held")
        return [(n, data) for n, data in self._events if n > number]

    def attach(self) -> int:
        """Make a new reader the only one."""
        self._reader += 1
        self._wake()
        return self._reader

    def is_current(self, reader: int) -> bool:
        return reader == self._reader

    @property
    def changed(self) -> anyio.Event:
        """Set at the next change; take it before reading, so no change slips between read and wait."""
        return self._changed

    def close(self) -> None:
        """No event follows (the session is over); GET readers end, a POST still writes its last answer."""
        self.finished = True
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()


class SessionStreams:
    """Every SSE stream of one transport session, found only by its key; bounded by :class:`ReplayLimits`."""

    def __init__(self, limits: ReplayLimits | None = None) -> None:
        self._limits = limits or ReplayLimits()
        # The GET stream lives as long as the session; response streams come and go.
        self.server = EventStream(self._limits)
        self._responses: OrderedDict[str, EventStream] = OrderedDict()

    def open_response_stream(self) -> EventStream:
        """A new stream for one POST response; the oldest finished response streams make room."""
        stream = EventStream(self._limits)
        self._responses[stream.key] = stream
        excess = len(self._responses) - self._limits.streams_per_session
        for key in [k for k, s in self._responses.items() if s.finished][: max(excess, 0)]:
            del self._responses[key]
        return stream

    def resume(self, last_event_id: str) -> tuple[EventStream, int]:
        """The stream ``last_event_id`` came from and the event number to replay after.

        Raises:
            LastEventIdUnknown: malformed, unknown, another session's, or no longer held.
        """
        key, _, number = last_event_id.rpartition("-")
        stream = self.server if key == self.server.key else self._responses.get(key)
        if stream is None or not number.isdigit():
            raise LastEventIdUnknown(cause="unknown")
        stream.after(int(number))  # refuses at once an id whose successors are gone
        return stream, int(number)

    def close(self) -> None:
        self.server.close()
        for stream in self._responses.values():
            stream.close()
        self._responses.clear()
