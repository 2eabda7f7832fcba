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
import psycopg

from bastion.store.migrations.postgres_0004_replicas import CHANNEL
from bastion.store.postgres import PostgresStore

__all__ = ["listen_for_changes"]

logger = logging.getLogger(__name__)


async def listen_for_changes(
    store: PostgresStore, nudge: Callable[[], None], *, retry_s: float = 1.0
) -> NoReturn:
    """Run until cancelled: each notification on the feed's channel calls ``nudge``."""
    # The pool's connection string (engine-internal, same package): the listener's own connection.
    conninfo = store._pool.conninfo
    if not isinstance(conninfo, str):  # pragma: no cover - PostgresStore.connect passes a string
        raise TypeError("the store's connection string is not a string")
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, application_name="bastion-listen"
            ) as conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                nudge()
                async for _ in conn.notifies():
                    nudge()
        except psycopg.Error as exc:
            logger.warning(
                "change notifications lost; polling meanwhile", extra={"detail": type(exc).__name__}
            )
        await anyio.sleep(retry_s)
