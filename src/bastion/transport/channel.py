"""One POST's answer stream (DESIGN section 5: a response goes only to the stream that asked).

A :class:`ResponseChannel` belongs to exactly one HTTP request. It answers
``application/json`` when the final message is ready before anything else
has to be sent, and commits to ``text/event-stream`` the moment a
notification or a server-to-client request for this request must go first.
Nothing else can write to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
from starlette.types import Send

from bastion.transport.jsonrpc import dumps

__all__ = ["ResponseChannel"]

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


def sse_frame(payload: bytes, event_id: int | None = None) -> bytes:
    head = b"" if event_id is None else b"id: %d\n" % event_id
    return head + b"event: message\ndata: " + payload + b"\n\n"


class ResponseChannel:
    """The answer to one HTTP request: JSON, or SSE once something must precede the result."""

    def __init__(self, send: Send, *, sse_allowed: bool, headers: Mapping[str, str] | None = None) -> None:
        self._send = send
        self.sse_allowed = sse_allowed
        self._headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self._lock = anyio.Lock()
        self.committed_sse = False
        self.finished = False
        self.broken = False

    async def message(self, message: dict[str, Any]) -> bool:
        """Send a message that belongs to this request before its result; ``False`` if it cannot go."""
        if not self.sse_allowed or self.finished or self.broken:
            return False
        async with self._lock:
            if self.finished:
                return False
            try:
                if not self.committed_sse:
                    await self._send(
                        {"type": "http.response.start", "status": 200, "headers": self._sse_headers()}
                    )
                    self.committed_sse = True
                await self._send(
                    {"type": "http.response.body", "body": sse_frame(dumps(message)), "more_body": True}
                )
            except OSError:
                self.broken = True
                return False
        return True

    async def finish(self, message: dict[str, Any], status: int = 200) -> None:
        """Send the final message and end the response."""
        async with self._lock:
            if self.finished:
                return
            self.finished = True
            body = dumps(message)
            try:
                if self.committed_sse:
                    await self._send(
                        {"type": "http.response.body", "body": sse_frame(body), "more_body": False}
                    )
                    return
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ]
                await self._send(
                    {"type": "http.response.start", "status": status, "headers": headers + self._headers}
                )
                await self._send({"type": "http.response.body", "body": body, "more_body": False})
            except OSError:
                self.broken = True

    async def end_empty(self) -> None:
        """End a response whose request was cancelled: an SSE stream just closes; JSON gets nothing."""
        async with self._lock:
            if self.finished:
                return
            self.finished = True
            try:
                if not self.committed_sse:
                    # Nothing was sent yet: an empty event stream ends the exchange without a
                    # response for the cancelled request (the client no longer wants one).
                    await self._send(
                        {"type": "http.response.start", "status": 200, "headers": self._sse_headers()}
                    )
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                self.broken = True

    def _sse_headers(self) -> list[tuple[bytes, bytes]]:
        return _SSE_HEADERS + self._headers
