"""Background tasks an owner starts in someone else's task group, and can stop before closing what they use.

The gateway's loops (heartbeats, probes, sweeps, peer takeover) run in the
lifespan's task group, which is cancelled only after the gateway closed. A
loop still running then would write to a store that is already closed
("store is closed" at every clean shutdown, issue #11 point 16). Shutdown
order is therefore: stop serving, stop the upstreams, **cancel these tasks
and wait for them to end**, and only then close the store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

__all__ = ["BackgroundTasks"]


class BackgroundTasks:
    """A set of started tasks that :meth:`cancel_and_wait` ends (and that never start after it)."""

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self._closed = False
        self._emptied = anyio.Event()

    @property
    def closed(self) -> bool:
        return self._closed

    def start_soon(
        self, task_group: anyio.abc.TaskGroup, fn: Callable[..., Awaitable[Any]], *args: Any
    ) -> None:
        async def run() -> None:
            if self._closed:
                return
            scope = anyio.CancelScope()
            self._scopes.add(scope)
            try:
                with scope:
                    await fn(*args)
            finally:
                self._scopes.discard(scope)
                if self._closed and not self._scopes:
                    self._emptied.set()

        task_group.start_soon(run)

    async def cancel_and_wait(self, timeout_s: float = 5.0) -> None:
        """Cancel every task and wait (bounded, shielded) until each has ended."""
        self._closed = True
        if not self._scopes:
            return
        for scope in list(self._scopes):
            scope.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s):
            await self._emptied.wait()
