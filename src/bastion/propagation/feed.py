"""The change feed: how a replica learns, in order and within a bound, what another replica did (#10).

:class:`ChangeFeed` is the interface the gateway follows. Both engines keep
the feed as an ordered table (``store/replicas.py``), so following it is one
cheap read of "changes after the last one I applied":

- :class:`PollingChangeFeed` reads it every ``interval_s`` (SQLite: a poll
  every 0.25 s keeps the bound well under one second);
- an engine with notifications (PostgreSQL ``LISTEN/NOTIFY``) calls
  :meth:`PollingChangeFeed.nudge` when one arrives, so the read happens at
  once; the poll stays as the fallback that keeps the bound when a
  notification is lost.

A follower starts at the feed's head: what happened before it started is in
the store already (a revoked agent session fails authentication; a
terminated transport session fails to load). It never skips a change: the
engines never reuse a ``seq``. A change that fails to apply is logged and
passed; a store read that fails is retried at the next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import anyio

from bastion.errors import StoreError
from bastion.store.failure_log import FailureLog
from bastion.store.replicas import Change, ReplicaRecords

__all__ = ["POLL_INTERVAL_S", "ChangeFeed", "PollingChangeFeed", "notifications_for"]

logger = logging.getLogger(__name__)

# The bound a poll keeps (plus one read and the apply); DESIGN section 7 asks for under one second.
POLL_INTERVAL_S = 0.25
_BATCH = 500

ApplyChange = Callable[[Change], Awaitable[None]]


def notifications_for(store: object) -> Callable[[Callable[[], None]], Coroutine[Any, Any, None]] | None:
    """The engine's notification listener (PostgreSQL ``LISTEN``), or ``None`` where there is none."""
    if type(store).__module__ != "bastion.store.postgres":
        return None  # SQLite, or a wrapping test store: the poll alone keeps the bound
    from bastion.store.postgres import PostgresStore
    from bastion.store.postgres_listen import listen_for_changes

    assert isinstance(store, PostgresStore)

    async def listen(nudge: Callable[[], None]) -> None:
        await listen_for_changes(store, nudge)

    return listen


class ChangeFeed(Protocol):
    """Delivers every change published after :meth:`start`, in ``seq`` order, to ``apply``."""

    async def start(self) -> None:
        """Fix the starting point (the feed's head now). Raises :class:`StoreError`."""
        ...

    async def follow(self, apply: ApplyChange) -> None:
        """Run until cancelled, applying each change once, in order."""
        ...


class PollingChangeFeed:
    """Reads the feed table every ``interval_s``, or at once when :meth:`nudge` is called."""

    def __init__(self, store: ReplicaRecords, *, interval_s: float = POLL_INTERVAL_S) -> None:
        self._store = store
        self._interval_s = interval_s
        self._cursor: int | None = None
        self._nudged = anyio.Event()
        self._failures = FailureLog(logger, "change feed read")  # one line per change (#23)

    @property
    def cursor(self) -> int | None:
        """The ``seq`` of the last change applied (or the head at start)."""
        return self._cursor

    async def start(self) -> None:
        self._cursor = await self._store.latest_change()

    def nudge(self) -> None:
        """A notification said something changed: read now rather than at the next tick."""
        self._nudged.set()

    async def follow(self, apply: ApplyChange) -> None:
        if self._cursor is None:
            await self.start()
        while True:
            await self.poll_once(apply)
            with anyio.move_on_after(self._interval_s):
                await self._nudged.wait()
            self._nudged = anyio.Event()

    async def poll_once(self, apply: ApplyChange) -> int:
        """Apply every change after the cursor now; returns how many."""
        assert self._cursor is not None
        applied = 0
        while True:
            try:
                batch = await self._store.changes_after(self._cursor, limit=_BATCH)
            except StoreError as exc:
                self._failures.failed(exc)
                return applied
            self._failures.worked()
            for change in batch:
                try:
                    await apply(change)
                except Exception:  # one bad change must not stop the feed
                    logger.exception("a change could not be applied", extra={"kind": change.kind.value})
                self._cursor = change.seq
                applied += 1
            if len(batch) < _BATCH:
                return applied
