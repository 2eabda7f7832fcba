"""Notifications of one upstream request, delivered without ever blocking the upstream's reader (issue 12).

A stdio upstream has one reader for every client behind the gateway. If that
reader awaited a client's socket, one client that stops reading would stall
the upstream for every other client. So the reader only *offers* a
notification to the request's :class:`NotificationBuffer` (never waits), and
the request's own task pumps the buffer to its client. A buffer holds at most
``max_bytes`` of undelivered notifications; one that fills is *overflowed*:
the caller cuts the stream (the call is cancelled upstream and ends outcome
unknown) rather than let the backpressure reach anyone else.
"""

from __future__ import annotations

import math
from typing import Any

import anyio

from bastion.upstream.relay import RequestRelay

__all__ = ["MAX_UNDELIVERED_BYTES", "NotificationBuffer"]

# Undelivered notification bytes one request may hold before its stream is cut.
MAX_UNDELIVERED_BYTES = 1024 * 1024


class NotificationBuffer:
    """A bounded queue from the upstream's reader to one request's client."""

    def __init__(self, relay: RequestRelay, max_bytes: int = MAX_UNDELIVERED_BYTES) -> None:
        self._relay = relay
        self._max_bytes = max_bytes
        self._queued_bytes = 0
        self._send, self._receive = anyio.create_memory_object_stream[tuple[str, dict[str, Any], int]](
            math.inf
        )
        self.overflowed = False

    def offer(self, method: str, params: dict[str, Any], size: int) -> None:
        """Queue a notification of ``size`` bytes without waiting; past the bound, mark overflowed."""
        if self.overflowed or self._relay.relay is None:
            return
        if self._queued_bytes + size > self._max_bytes:
            self.overflowed = True
            return
        try:
            self._send.send_nowait((method, params, size))
        except anyio.ClosedResourceError:
            return  # the request already ended: nobody is left to tell
        self._queued_bytes += size

    async def pump(self) -> None:
        """Deliver queued notifications to the client, in order, until :meth:`close` and drained."""
        async with self._receive:
            async for method, params, size in self._receive:
                try:
                    await self._relay.on_notification(method, params)
                finally:
                    self._queued_bytes -= size

    def close(self) -> None:
        """No more notifications: :meth:`pump` ends once what is queued is delivered."""
        self._send.close()
