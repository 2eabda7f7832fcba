"""Following one upstream session's GET stream (session era; DESIGN section 0).

A session-era server sends what no request caused (``list_changed``,
``notifications/resources/updated``) on the session's GET stream. Bastion follows
the catalog session's stream for the whole run, and a client's own upstream
session's stream once that client subscribes to a resource there (issue 9).
The stream is reconnected with backoff and resumed after the last event seen;
it ends when the upstream refuses it (any status but 200) or when the caller's
scope is cancelled. Never sends a request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bastion.errors import UpstreamProtocolError
from bastion.policy.snapshot import DEFAULT_MAX_RESPONSE_BYTES
from bastion.upstream.http_client import HttpFailure, UpstreamHttp
from bastion.upstream.sse import SseCursor, iter_sse_messages

__all__ = ["follow_session_stream"]


async def follow_session_stream(
    client: UpstreamHttp,
    url: str,
    headers: dict[str, str],
    on_message: Callable[[dict[str, Any]], Awaitable[None]],
    *,
    opened: anyio.Event | None = None,
    max_event_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> None:
    """Hand every message of the stream to ``on_message`` until cancelled or refused.

    ``opened`` is set once the first attempt has an answer (or failed), so a caller
    can wait until messages sent from then on will be seen. An event over ``max_event_bytes``
    drops the connection (``UpstreamResponseTooLarge`` is an ``UpstreamProtocolError``); the
    stream is then reconnected with backoff, as after any break.
    """
    backoff = 0.5
    cursor = SseCursor()  # a reconnection resumes after the last event seen
    while True:
        resume = {"last-event-id": cursor.last_event_id} if cursor.last_event_id else {}
        try:
            async with client.stream(
                "GET",
                url,
                headers={**headers, "accept": "text/event-stream", **resume},
                read_timeout_s=None,
            ) as response:
                if opened is not None:
                    opened.set()
                if response.status_code != 200:
                    return
                backoff = 0.5
                async for message in iter_sse_messages(
                    response.aiter_bytes(), cursor, max_event_bytes=max_event_bytes
                ):
                    await on_message(message)
        except (HttpFailure, UpstreamProtocolError):
            pass
        if opened is not None:
            opened.set()
        await anyio.sleep(backoff)
        backoff = min(backoff * 2, 10.0)
