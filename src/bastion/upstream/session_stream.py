"""Following one upstream session's GET stream (session era; DESIGN sections 0 and 5).

A session-era server sends what no request caused (``list_changed``,
``notifications/resources/updated``, log messages, and, for an ``mcp`` 1.x server, the
``roots/list`` or ``sampling/createMessage`` a tool asks) on the session's GET stream.
Bastion follows the catalog session's stream for the whole run, and each client's own
upstream session's stream from its opening (issue 22; issue 9 opened it at a subscription),
as many at once per upstream as :class:`StreamBudget` allows, each closed with its session.
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
from bastion.upstream.base import SessionChannel
from bastion.upstream.http_client import HttpFailure, UpstreamHttp
from bastion.upstream.sse import SseCursor, iter_sse_messages

__all__ = ["MAX_CLIENT_STREAMS", "ChannelRelay", "StreamBudget", "follow_session_stream"]

# Client sessions' GET streams followed at once per upstream. Each holds one connection of the
# gateway's pool (256): the bound leaves most of it to calls.
MAX_CLIENT_STREAMS = 96


class StreamBudget:
    """How many client sessions' GET streams one upstream may follow at once."""

    def __init__(self, limit: int = MAX_CLIENT_STREAMS) -> None:
        self._limit = limit
        self.held = 0

    def take(self) -> bool:
        """Whether one more stream may be followed (it is then counted until :meth:`give_back`)."""
        if self.held >= self._limit:
            return False
        self.held += 1
        return True

    def give_back(self) -> None:
        self.held = max(0, self.held - 1)


class ChannelRelay:
    """A :class:`~bastion.upstream.base.CallRelay` onto an owner's channel: for a request that an
    upstream session's GET stream brings while none of its owner's calls is in flight there."""

    def __init__(self, channel: SessionChannel) -> None:
        self._channel = channel

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._channel.notify(method, params)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self._channel.request(method, params)

    async def pause(self, retry_ms: int | None) -> None:
        return None  # no request stream to end


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
