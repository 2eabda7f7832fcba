"""One POST's answer stream (DESIGN section 5: a response goes only to the stream that asked).

A :class:`ResponseChannel` belongs to exactly one HTTP request. It answers
``application/json`` when the final message is ready before anything else
has to be sent, and commits to ``text/event-stream`` the moment a
notification or a server-to-client request for this request must go first,
or at once for a client whose ``Accept`` ranks the stream first (``prefer_sse``:
``wire.prefers_sse``; a result with another HTTP status than 200 stays JSON, since a
stream's status is 200). Nothing else can write to it.

In the session era an SSE answer is also an :class:`~bastion.session.replay.EventStream`
of its session: each event is numbered and kept, so a client that loses the
connection resumes it with a GET and ``Last-Event-ID`` (``transport/resume.py``).
From the moment such a GET takes the stream over, this channel writes nothing
more; the rest of the answer goes to the GET. Such a stream opens with a priming
event (``transport/sse_out.py``). When the upstream serving the request ends its own
stream mid-call to be polled (SEP-1699), :meth:`ResponseChannel.pause` does the same
here: the client's POST response ends after the priming event, and the rest of the
answer waits in the stream for the client's GET with ``Last-Event-ID``.

A slow answer (issue 22: a first request that waits for its own stdio processes to start) would
send nothing for as long as it takes, and a client's read timeout would end it. While
:meth:`ResponseChannel.kept_alive` holds, a client that accepted SSE gets the stream after
``interval_s`` with nothing to say (committed as a notification would commit it) and then an SSE
comment every ``interval_s`` until the answer. A comment is not an event: it is never numbered
or kept, and once a GET took the stream over (or a pause let the POST go) this channel writes none.
A JSON-only answer cannot carry one and waits as before. Only a timer waits per request; a task
runs only to write a comment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import anyio
from starlette.types import Send

from bastion.session.replay import EventStream
from bastion.transport.jsonrpc import dumps
from bastion.transport.sse_out import KEEPALIVE_FRAME, SSE_HEADERS, priming_frame, sse_frame
from bastion.transport.wire import detached

__all__ = ["ResponseChannel"]


class ResponseChannel:
    """The answer to one HTTP request: JSON, or SSE once something must precede the result."""

    def __init__(
        self,
        send: Send,
        *,
        sse_allowed: bool,
        headers: Mapping[str, str] | None = None,
        open_stream: Callable[[], EventStream] | None = None,
        priming: bool = False,
        prefer_sse: bool = False,
    ) -> None:
        self._send = send
        self.sse_allowed = sse_allowed
        self._prefer_sse = prefer_sse and sse_allowed
        self._headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self._lock = anyio.Lock(fast_acquire=True)  # uncontended: no loop turn per answer
        self.committed_sse = False
        self.finished = False
        self.broken = False
        # Session era: where SSE events are numbered and kept for resumption (None: no ids).
        self._open_stream = open_stream
        # The session negotiated 2025-11-25 or later: its streams prime, and may be paused.
        self._priming = priming and open_stream is not None
        self._stream: EventStream | None = None
        self._reader = 0
        # The POST response ended mid-call (the upstream's polling close, mirrored): events are
        # only kept for the client's GET from then on.
        self._detached = False
        # While the answer is awaited (kept_alive): the next comment's timer, its write.
        self._awaiting = False
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._keepalive_write: asyncio.Task[None] | None = None

    def _frame(self, payload: bytes) -> bytes | None:
        """Number and keep ``payload`` (session era); the frame to write here, or None if taken over."""
        if self._stream is None:
            return sse_frame(payload)
        number = self._stream.publish(payload)
        if self._detached or not self._stream.is_current(self._reader):
            return None  # a GET with Last-Event-ID resumed this stream: it writes from now on
        return sse_frame(payload, self._stream.event_id(number))

    async def message(self, message: dict[str, Any]) -> bool:
        """Send a message that belongs to this request before its result; ``False`` if it cannot go."""
        if not self.sse_allowed or self.finished or self.broken:
            return False
        async with self._lock:
            if self.finished:
                return False
            try:
                if not self.committed_sse:
                    await self._commit_sse(None)
                frame = self._frame(dumps(message))
                if frame is not None:
                    await self._send({"type": "http.response.body", "body": frame, "more_body": True})
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
                if self._prefer_sse and not self.committed_sse and status == 200:
                    await self._commit_sse(None)
                if self.committed_sse:
                    frame = self._frame(body)
                    if self._stream is not None:
                        self._stream.finish()
                    if not self._detached:
                        await self._send(
                            {"type": "http.response.body", "body": frame or b"", "more_body": False}
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
            if self._stream is not None:
                self._stream.finish()  # a resumed GET ends too: no answer follows a cancellation
            if self._detached:
                return
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

    async def pause(self, retry_ms: int | None) -> None:
        """End the POST response mid-call, as the upstream ended its stream to be polled (SEP-1699).

        Sessions of 2025-11-25 or later only (events need ids, and the client must know polling):
        the stream's priming event tells the
        client where to resume and when; everything after it, the answer included, goes to the
        client's GET with ``Last-Event-ID``. Elsewhere the answer simply stays on this response.
        """
        if not self.sse_allowed or not self._priming or self.finished or self.broken:
            return
        async with self._lock:
            if self.finished or self._detached:
                return
            try:
                if not self.committed_sse:
                    await self._commit_sse(retry_ms)
                self._detached = True
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                self.broken = True

    async def _commit_sse(self, retry_ms: int | None) -> None:
        """Start the SSE response; in the session era, open its event stream with a priming event."""
        await self._send({"type": "http.response.start", "status": 200, "headers": self._sse_headers()})
        self.committed_sse = True
        if self._open_stream is not None:
            self._stream = self._open_stream()
            self._reader = self._stream.attach()
            if self._priming:
                priming = priming_frame(self._stream.event_id(self._stream.last_number()), retry_ms)
                await self._send({"type": "http.response.body", "body": priming, "more_body": True})

    @contextlib.contextmanager
    def kept_alive(self, interval_s: float) -> Iterator[None]:
        """While inside, an SSE-capable answer gets a comment line every ``interval_s`` of silence."""
        if not self.sse_allowed:
            yield
            return
        self._awaiting = True
        self._keepalive_timer = asyncio.get_running_loop().call_later(interval_s, self._tick, interval_s)
        try:
            yield
        finally:
            self._awaiting = False
            self._keepalive_timer.cancel()

    def _tick(self, interval_s: float) -> None:
        self._keepalive_write = detached(self._keep_alive(interval_s))

    async def _keep_alive(self, interval_s: float) -> None:
        async with self._lock:
            # The answer came meanwhile, or this POST no longer carries the stream: nothing to add.
            if not self._awaiting or self.finished or self.broken or self._detached:
                return
            try:
                if not self.committed_sse:
                    await self._commit_sse(None)
                if self._stream is not None and not self._stream.is_current(self._reader):
                    return  # a GET with Last-Event-ID resumed this stream: it keeps itself alive
                await self._send({"type": "http.response.body", "body": KEEPALIVE_FRAME, "more_body": True})
            except OSError:
                self.broken = True
                return
        if self._awaiting:
            self._keepalive_timer = asyncio.get_running_loop().call_later(interval_s, self._tick, interval_s)

    def _sse_headers(self) -> list[tuple[bytes, bytes]]:
        return SSE_HEADERS + self._headers
