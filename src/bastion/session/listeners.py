"""Open ``subscriptions/listen`` streams of sessionless clients (DESIGN sections 0 and 5; spec 2026-07-28).

The sessionless era has no GET stream: a client that wants change
notifications sends ``subscriptions/listen`` and its response stays open as
the stream. A :class:`ListenerHub` belongs to one gateway and holds every open
listen stream with the principal that opened it, so a change reaches exactly
the streams whose principal sees it and that asked for its kind. Each stream
buffers a bounded number of events; a client that stops reading has its stream
ended at the bound (it re-listens and refetches: listen streams have no
replay, per the spec). Nothing here is process-global.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from bastion.auth.principal import Principal

__all__ = [
    "HONORED_KINDS",
    "PROMPTS_LIST_CHANGED",
    "RESOURCES_LIST_CHANGED",
    "TOOLS_LIST_CHANGED",
    "ListenStream",
    "ListenerHub",
    "honored_filter",
]

TOOLS_LIST_CHANGED = "toolsListChanged"
PROMPTS_LIST_CHANGED = "promptsListChanged"  # issue 9
RESOURCES_LIST_CHANGED = "resourcesListChanged"  # issue 9
# Filter keys this gateway delivers; others are left out of the acknowledgment, as the spec asks.
HONORED_KINDS: frozenset[str] = frozenset({TOOLS_LIST_CHANGED, PROMPTS_LIST_CHANGED, RESOURCES_LIST_CHANGED})
_BUFFERED_EVENTS = 64
# One queued notification: its method and its params (``_meta`` is added when it is written).
Notification = tuple[str, dict[str, Any]]


def honored_filter(requested: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``requested`` this gateway will deliver (the acknowledgment's ``notifications``)."""
    return {kind: True for kind in sorted(HONORED_KINDS) if requested.get(kind) is True}


@dataclass(eq=False)
class ListenStream:
    """One open listen stream: whose it is, what it asked for, and its bounded event buffer."""

    principal: Principal
    kinds: frozenset[str]
    _send: MemoryObjectSendStream[Notification] = field(repr=False)
    events: MemoryObjectReceiveStream[Notification] = field(repr=False)

    def offer(self, kind: str, method: str) -> None:
        """Queue ``method`` if this stream asked for ``kind``; a full buffer ends the stream."""
        if kind in self.kinds:
            self.deliver(method, {})

    def deliver(self, method: str, params: dict[str, Any]) -> None:
        """Queue one notification the caller already decided this stream gets; a full buffer ends it."""
        try:
            self._send.send_nowait((method, params))
        except anyio.WouldBlock:
            self.end()  # the reader sees the end; the client re-listens and refetches
        except anyio.ClosedResourceError:
            pass

    def end(self) -> None:
        """End the stream: its reader sees the end after the events already queued."""
        self._send.close()


class ListenerHub:
    """Every open listen stream of one gateway."""

    def __init__(self, *, buffered_events: int = _BUFFERED_EVENTS) -> None:
        self._streams: set[ListenStream] = set()
        self._buffered_events = buffered_events

    def __len__(self) -> int:
        return len(self._streams)

    @contextlib.contextmanager
    def open(self, principal: Principal, kinds: frozenset[str]) -> Iterator[ListenStream]:
        """Register a stream for the life of one listen request; it is gone when the request ends."""
        send, receive = anyio.create_memory_object_stream[Notification](self._buffered_events)
        stream = ListenStream(principal, kinds, send, receive)
        self._streams.add(stream)
        try:
            yield stream
        finally:
            self._streams.discard(stream)
            send.close()
            receive.close()

    def publish(self, kind: str, method: str, sees: Callable[[Principal], bool]) -> None:
        """Offer one change to every stream whose principal ``sees`` it."""
        for stream in list(self._streams):
            if sees(stream.principal):
                stream.offer(kind, method)

    def close_all(self) -> None:
        """End every stream gracefully (gateway shutdown): each answers its final result."""
        for stream in list(self._streams):
            stream.end()
