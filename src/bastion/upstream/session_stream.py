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
import httpx2 as httpx

from bastion.errors import UpstreamProtocolError
from bastion.upstream.sse import SseCursor, iter_sse_messages

__all__ = ["follow_session_stream"]


async def follow_session_stream(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    on_message: Callable[[dict[str, Any]], Awaitable[None]],
    *,
    opened: anyio.Event | None = None,
) -> None:
    """Hand every message of the stream to ``on_message`` until cancelled or refused.

    ``opened`` is set once the first attempt has an answer (or failed), so a caller
    can wait until messages sent from then on will be seen.
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
                timeout=httpx.Timeout(None, connect=5.0),
            ) as response:
                if opened is not None:
                    opened.set()
                if response.status_code != 200:
                    return
                backoff = 0.5
                async for message in iter_sse_messages(response.aiter_bytes(), cursor):
                    await on_message(message)
        except (httpx.HTTPError, UpstreamProtocolError):
            pass
        if opened is not None:
            opened.set()
        await anyio.sleep(backoff)
        backoff = min(backoff * 2, 10.0)
