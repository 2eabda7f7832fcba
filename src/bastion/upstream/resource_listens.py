"""A sessionless upstream's resource subscriptions (issue 9; spec 2026-07-28, ``subscriptions/listen``).

The 2026-07-28 wire has no ``resources/subscribe``: a client names the URIs it
wants ``notifications/resources/updated`` for in a ``subscriptions/listen``
request's ``resourceSubscriptions``, and the response stream carries them. Bastion
holds one such listen stream per URI that some client subscribed to, shared by
every subscriber (the gateway's ``surface/subscriptions.py`` counts them and
releases the URI when the last one leaves). The stream is reopened with backoff
if the upstream ends it. The updates themselves are read by the upstream's
response-stream reader (``streamable_http.py``), which tells the gateway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from bastion.errors import UpstreamError
from bastion.upstream.base import UpstreamReplied
from bastion.upstream.relay import RequestRelay

__all__ = ["ACK_TIMEOUT_S", "ResourceListens"]

# How long a subscriber waits for the upstream's acknowledgment before it is answered anyway.
ACK_TIMEOUT_S = 10.0
_ACKNOWLEDGED = "notifications/subscriptions/acknowledged"

Listen = Callable[[dict[str, Any], RequestRelay], Awaitable[dict[str, Any]]]


class _AckRelay(RequestRelay):
    """The relay of one held listen stream: it only waits for the acknowledgment."""

    def __init__(self) -> None:
        super().__init__(None, None)
        self.acknowledged = anyio.Event()

    async def on_notification(self, method: str, params: dict[str, Any]) -> None:
        if method == _ACKNOWLEDGED:
            self.acknowledged.set()


class ResourceListens:
    """The listen streams one sessionless upstream holds, one per subscribed URI."""

    def __init__(self, listen: Listen) -> None:
        self._listen = listen
        self._scopes: dict[str, anyio.CancelScope] = {}

    def __contains__(self, uri: object) -> bool:
        return uri in self._scopes

    async def hold(self, uri: str, task_group: anyio.abc.TaskGroup) -> None:
        """Open the stream for ``uri`` (once) and wait for its acknowledgment, at most ``ACK_TIMEOUT_S``."""
        if uri in self._scopes:
            return
        scope = anyio.CancelScope()
        self._scopes[uri] = scope
        relay = _AckRelay()
        task_group.start_soon(self._follow, uri, scope, relay)
        with anyio.move_on_after(ACK_TIMEOUT_S):
            await relay.acknowledged.wait()

    def release(self, uri: str) -> None:
        scope = self._scopes.pop(uri, None)
        if scope is not None:
            scope.cancel()  # closing the stream is the 2026 wire's unsubscribe

    def release_all(self) -> None:
        for uri in list(self._scopes):
            self.release(uri)

    async def _follow(self, uri: str, scope: anyio.CancelScope, relay: _AckRelay) -> None:
        params = {"notifications": {"resourceSubscriptions": [uri]}}
        backoff = 0.5
        with scope:
            while True:
                try:
                    await self._listen(params, relay)
                    backoff = 0.5  # a graceful end: listen again
                except (UpstreamError, UpstreamReplied):
                    relay.acknowledged.set()  # never make a subscriber wait on a broken upstream
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
