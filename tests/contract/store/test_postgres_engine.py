"""What only the PostgreSQL engine has: its migrations under an advisory lock, its error boundary, its URL.

The contract itself runs on this engine through the ``store`` fixture; these
cases cover what the contract cannot name (a migrator racing another, a
database newer than the code, a driver error, a password in a URL).
"""

from __future__ import annotations

import anyio
import asyncpg
import psycopg
import pytest
from store_support import AGENT, EID, new_writer

from bastion.errors import NotDurable, StoreError
from bastion.ids import CallId
from bastion.store.dsn import redact_dsn
from bastion.store.migrations import POSTGRES_MIGRATIONS
from bastion.store.postgres import PostgresStore, apply_migrations
from tests.support.pg_cluster import ThrowawayCluster

pytestmark = pytest.mark.anyio

BINDING = "ab" * 32


async def _version(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute("SELECT version FROM schema_version")
        rows = await cursor.fetchall()
    assert len(rows) == 1
    return int(rows[0][0])


async def test_concurrent_migrators_migrate_once(postgres_url: str) -> None:
    """Eight migrators on one fresh schema, released together: all succeed, the schema is built once."""
    start = anyio.Event()
    reached: list[int] = []

    async def migrate() -> None:
        conn = await asyncpg.connect(postgres_url)
        try:
            await start.wait()
            reached.append(await apply_migrations(conn))
        finally:
            await conn.close()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(migrate)
            await anyio.sleep(0)
            start.set()
    assert reached == [len(POSTGRES_MIGRATIONS)] * 8
    assert await _version(postgres_url) == len(POSTGRES_MIGRATIONS)


async def test_replicas_starting_together_share_one_schema(postgres_url: str) -> None:
    """Three stores connecting at once to a fresh database all open, and each sees the others' writes."""
    stores: list[PostgresStore] = []

    async def connect() -> None:
        stores.append(await PostgresStore.connect(postgres_url))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(connect)
    try:
        writer = await new_writer(stores[0], "gw-a", "gateway-0")
        await stores[0].reserve_execution(
            AGENT, EID, BINDING, call_id=CallId("c1"), worker=writer.worker, epoch=writer.epoch
        )
        for other in stores[1:]:
            record = await other.get_execution(AGENT, EID)
            assert record is not None and record.worker == writer.worker
    finally:
        for opened in stores:
            await opened.aclose()


async def test_a_newer_database_is_refused(postgres_url: str) -> None:
    """A database whose schema version is above this code's is refused at connect, and left as it was."""
    async with await PostgresStore.connect(postgres_url):
        pass
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute("UPDATE schema_version SET version = %s", (len(POSTGRES_MIGRATIONS) + 1,))
    with pytest.raises(StoreError) as caught:
        await PostgresStore.connect(postgres_url)
    assert "newer" in caught.value.message
    assert caught.value.data["database_version"] == len(POSTGRES_MIGRATIONS) + 1
    assert await _version(postgres_url) == len(POSTGRES_MIGRATIONS) + 1


async def test_an_unreachable_server_is_a_store_error_without_the_password(
    postgres_cluster: ThrowawayCluster,
) -> None:
    """Connecting where no server listens raises StoreError; its message and data hold no password."""
    url = f"postgresql://bastion:s3cret-pw@/bastion?host={postgres_cluster.root}/nowhere&connect_timeout=2"
    with pytest.raises(StoreError) as caught:
        await PostgresStore.connect(url, pool_timeout_s=2)
    assert "s3cret-pw" not in str(caught.value)
    assert "s3cret-pw" not in repr(caught.value.data)
    assert caught.value.data["store"] == redact_dsn(url)


async def test_libpq_url_parameters_are_taken_as_libpq_takes_them(postgres_url: str) -> None:
    """``connect_timeout`` bounds the connect (it is no server setting); ``options`` and
    ``application_name`` reach the server as settings, so a store opened with all three works."""
    url = f"{postgres_url}&connect_timeout=5&application_name=bastion-test"
    async with await PostgresStore.connect(url) as store:
        writer = await new_writer(store, "gw-a", "gateway-0")
        await store.reserve_execution(
            AGENT, EID, BINDING, call_id=CallId("c1"), worker=writer.worker, epoch=writer.epoch
        )
        record = await store.get_execution(AGENT, EID)
        assert record is not None and record.binding == BINDING
    conn = await asyncpg.connect(url.replace("&connect_timeout=5", ""))
    try:
        assert await conn.fetchval("SHOW application_name") == "bastion-test"
    finally:
        await conn.close()


async def test_driver_errors_become_store_errors(postgres_url: str) -> None:
    """A write that the server fails (its table is gone) raises NotDurable; a read raises StoreError."""
    async with await PostgresStore.connect(postgres_url) as store:
        writer = await new_writer(store, "gw-a", "gateway-0")
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            await conn.execute("DROP TABLE executions")
        with pytest.raises(NotDurable):
            await store.reserve_execution(
                AGENT, EID, BINDING, call_id=CallId("c1"), worker=writer.worker, epoch=writer.epoch
            )
        with pytest.raises(StoreError) as caught:
            await store.get_execution(AGENT, EID)
        assert caught.value.data["detail"] == "UndefinedTable"


def test_redact_dsn_hides_every_password() -> None:
    """Passwords in the authority and in the query are replaced; everything else is kept."""
    assert redact_dsn("postgresql://app:pw@db:5432/bastion") == "postgresql://app:***@db:5432/bastion"
    assert redact_dsn("postgresql://db/bastion?user=app&password=pw") == (
        "postgresql://db/bastion?user=app&password=***"
    )
    assert redact_dsn("postgresql://app@db/bastion") == "postgresql://app@db/bastion"
