"""PostgreSQL ``LISTEN`` for the change feed (DESIGN section 7, issue #10).

Every insert into ``changes`` sends ``NOTIFY bastion_changes`` at commit
(migration ``postgres_0004_replicas``). :func:`listen_for_changes` holds one
connection of its own (never one of the pool's) listening on that channel
and calls ``nudge`` for each notification, so the feed is read at once. It
reconnects after a failure, nudging once on each (re)connect to cover what
it may have missed; the feed's poll keeps the bound meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import anyio
import asyncpg

from bastion.store.failure_log import FailureLog
from bastion.store.migrations.postgres_0004_replicas import CHANNEL
from bastion.store.postgres import PostgresStore

__all__ = ["listen_for_changes"]

logger = logging.getLogger(__name__)


async def listen_for_changes(
    store: PostgresStore, nudge: Callable[[], None], *, retry_s: float = 1.0
) -> NoReturn:
    """Run until cancelled: each notification on the feed's channel calls ``nudge``."""
    log = FailureLog(logger, "listening for change notifications")  # one line per change (#23)

    def listening() -> None:
        log.worked()
        nudge()

    while True:
        try:
            await _listen_until_lost(store, listening)
            lost: BaseException = ConnectionError("connection closed")
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            lost = exc
        log.failed(lost, note="; polling meanwhile")
        await anyio.sleep(retry_s)


async def _listen_until_lost(store: PostgresStore, nudge: Callable[[], None]) -> None:
    """One connection's life: listen, nudge once (what came before it), nudge per notification."""
    conn = await store.connect_alone("bastion-listen")
    lost = anyio.Event()
    try:
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(CHANNEL, lambda *_: nudge())
        nudge()
        await lost.wait()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await conn.close()
