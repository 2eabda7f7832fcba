"""Resuming an upstream SSE stream that ends or drops before its answer (issue 8 point 7, upstream side).

Owns: reading the JSON-RPC messages of one upstream response stream and, when that stream
ends or breaks before the caller has what it waits for, reconnecting with ``GET`` and
``Last-Event-ID`` (2025-11-25 Streamable HTTP, "Resumability and Redelivery") so the
upstream replays what was missed and carries on. The caller stops reading once it has its
answer; this module never decides what an answer is.

Rules:

1. only where resuming is possible: the stream gave an event id (an upstream without an
   event store gives none) and the caller supplies a ``reconnect`` (a session-era upstream
   session; the sessionless era has no GET);
2. wait the upstream's ``retry:`` hint (bounded) before reconnecting;
3. give up after ``max_quiet`` reconnections in a row that brought no event, or when the
   upstream refuses the GET: the stream simply ends, and the caller's "closed without a
   result" (``outcome_unknown``) stands, as without resumption;
4. a stream that *ended* (not broke) before the answer is the upstream's polling close
   (SEP-1699): ``on_pause`` hears of it, with the retry hint, before the reconnection, so
   the gateway can let its own client go the same way (``transport/channel.py``).

Never resends the request itself: a resumed stream can only replay, never act twice.

Once the caller's answer has come (``is_last``), the rest of that stream is read and dropped,
for at most ``DRAIN_S``: an upstream ends the stream right after the answer, and a response
read to its end hands its kept-alive connection back to the pool. Left half-read, the
connection is closed instead and the next call pays a new TCP connection on both sides.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio

from bastion.policy.snapshot import DEFAULT_MAX_RESPONSE_BYTES
from bastion.upstream.http_client import HttpFailure, UpstreamResponse
from bastion.upstream.sse import SseCursor, iter_sse_messages

__all__ = ["DRAIN_S", "Reconnect", "messages_resuming"]

# GET <url> with this Last-Event-ID, as an open streamed response.
Reconnect = Callable[[str], AbstractAsyncContextManager[UpstreamResponse]]

_DEFAULT_RETRY_S = 0.5
_MAX_RETRY_S = 5.0
# How long the end of a stream is awaited once its answer is in; past it the connection is closed.
DRAIN_S = 0.1


async def messages_resuming(
    response: UpstreamResponse,
    reconnect: Reconnect | None,
    *,
    is_last: Callable[[dict[str, Any]], bool] | None = None,
    max_quiet: int = 3,
    on_pause: Callable[[int | None], Awaitable[None]] | None = None,
    max_event_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> AsyncGenerator[dict[str, Any], None]:
    """The messages of ``response``, then of each resumed stream, until one ends for good.

    After a message for which ``is_last`` holds, nothing more is yielded: the stream is
    drained (bounded) and the messages end, without resuming.

    Raises:
        UpstreamProtocolError: an event whose data is not a JSON object.
        UpstreamResponseTooLarge: an event over ``max_event_bytes`` (never resumed past: the
            replay would hold the same event).
        HttpFailure: the stream broke and cannot be resumed (no id, no ``reconnect``).
    """
    cursor = SseCursor()
    quiet = 0
    async with contextlib.AsyncExitStack() as streams:
        source = response
        while True:
            seen = cursor.events
            messages = iter_sse_messages(source.aiter_bytes(), cursor, max_event_bytes=max_event_bytes)
            ended = False
            try:
                async for message in messages:
                    yield message
                    if is_last is not None and is_last(message):
                        if source.ended:  # the stream already ended: nothing left to drain
                            await messages.aclose()
                        else:
                            await _drain(messages)
                        return
                ended = True
            except HttpFailure:
                # (1) A broken stream is resumable only under the same conditions as an ended one.
                if reconnect is None or not cursor.last_event_id:
                    raise
            if reconnect is None or not cursor.last_event_id:
                return
            if ended and on_pause is not None:
                await on_pause(cursor.retry_ms)  # (4)
            # (3) Reconnections that bring nothing are bounded.
            quiet = 0 if cursor.events > seen else quiet + 1
            if quiet > max_quiet:
                return
            # (2) The upstream's pace, within bounds.
            hint = cursor.retry_ms / 1000 if cursor.retry_ms is not None else _DEFAULT_RETRY_S
            await anyio.sleep(min(hint, _MAX_RETRY_S))
            await streams.aclose()
            source = await streams.enter_async_context(reconnect(cursor.last_event_id))
            content_type = source.headers.get("content-type", "")
            if source.status_code != 200 or not content_type.startswith("text/event-stream"):
                return


async def _drain(messages: AsyncGenerator[dict[str, Any], None]) -> None:
    """Read what is left of a stream whose answer is in, for at most ``DRAIN_S``; never raises."""
    with contextlib.suppress(Exception), anyio.move_on_after(DRAIN_S):
        async for _ in messages:
            pass
    await messages.aclose()
