"""The PostgreSQL engine of the store contract (DESIGN section 7): several replicas on one database.

What it guarantees, and how:

- **Durable.** A write returns only after its transaction committed (the
  server's ``synchronous_commit``, ``on`` by default, decides what that means
  on disk; set it no lower in production).
- **Atomic across replicas.** Each write is one transaction at ``READ
  COMMITTED``; the shared operations (``store/ops/``) read the rows they
  decide on with row locks: a writer's generation ``FOR KEY SHARE`` (a
  takeover locks it ``FOR UPDATE``, so it waits for writes already fenced),
  an execution row or a chain head ``FOR UPDATE``. A transaction that loses a
  race it could not lock against (two inserts of one new key, a deadlock, a
  serialization failure) is rolled back and the whole operation runs again, up
  to :data:`ATTEMPTS` times; the second run sees the winner's row and decides
  on it like any other (an execution in flight, a chain that exists).
- **Errors at the boundary.** Driver errors never leave this module: a
  constraint violation is :class:`Conflict`; anything else during a write is
  :class:`NotDurable` (the write may or may not have landed), during a read
  :class:`StoreError`. No message carries the connection string.
- **Versioned schema.** ``store/migrations/postgres_*`` is applied at connect
  in one transaction under ``pg_advisory_xact_lock``, so replicas starting
  together migrate once; a database newer than this code is refused.

A write, once started, runs to its end even if its caller is cancelled
(shielded, bounded by ``statement_timeout``), so a connection never goes back
to the pool mid-transaction. Nothing here is process-global: two stores may
share one database in one process, as two replicas would.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import anyio
import psycopg
import psycopg.errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bastion.errors import Conflict, NotDurable, StoreError
from bastion.store.base import Store
from bastion.store.dsn import redact_dsn
from bastion.store.migrations import POSTGRES_MIGRATIONS
from bastion.store.operations import StoreOperations
from bastion.store.statements import Fetch, Op, OpFactory

__all__ = ["ATTEMPTS", "MIGRATION_LOCK", "PostgresStore", "apply_migrations"]

T = TypeVar("T")

ATTEMPTS = 8
"""Runs of one write before a lost race is reported (as :class:`Conflict` or :class:`NotDurable`)."""

MIGRATION_LOCK = 0x62617374696F6E  # "bastion": the advisory lock key every migrator takes
_RACES = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
)


class PostgresStore(StoreOperations):
    """The store on one PostgreSQL database. Build it with :meth:`connect`; end it with :meth:`aclose`."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, redacted: str, pool_timeout_s: float) -> None:
        """Private: use :meth:`connect`."""
        self._pool = pool
        self._redacted = redacted
        self._pool_timeout_s = pool_timeout_s
        self._closed = False
        self._running = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._transactions = 0
        self._statements = 0

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        pool_timeout_s: float = 10.0,
        statement_timeout_s: float = 30.0,
    ) -> PostgresStore:
        """Connect to the database at ``dsn`` (a libpq URL or key=value string) and migrate it.

        Raises :class:`StoreError` (naming the URL without its password) when the
        server cannot be reached or the database has a schema newer than this code.
        """
        redacted = redact_dsn(dsn)
        timeout_ms = int(statement_timeout_s * 1000)

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            # Set per connection, so the URL's own ``options`` (a search_path, say) stay as given.
            await conn.execute(f"SET statement_timeout = {timeout_ms}")
            await conn.execute(f"SET lock_timeout = {timeout_ms}")

        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=pool_timeout_s,
            name="bastion-store",
            kwargs={"autocommit": True, "application_name": "bastion"},
            configure=configure,
        )
        try:
            await pool.open(wait=True, timeout=pool_timeout_s)
            async with pool.connection() as conn:
                await apply_migrations(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            await pool.close()
            raise StoreError(
                "cannot open the PostgreSQL store", store=redacted, detail=type(exc).__name__
            ) from None
        except BaseException:
            await pool.close()
            raise
        return cls(pool, redacted=redacted, pool_timeout_s=pool_timeout_s)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def location(self) -> str:
        """The database URL, password redacted: safe to log."""
        return self._redacted

    @property
    def committed_transactions(self) -> int:
        """Write transactions committed so far."""
        return self._transactions

    @property
    def statements_run(self) -> int:
        """Statements sent so far, reads and writes, retries included (for the bench)."""
        return self._statements

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(30):
            await self._idle.wait()
        await self._pool.close()

    # ------------------------------------------------------------ the engine

    async def _write(self, op: OpFactory[T]) -> T:
        self._enter()
        try:
            with anyio.CancelScope(shield=True):
                result = await self._write_with_retries(op)
        finally:
            self._leave()
        return result

    async def _write_with_retries(self, op: OpFactory[T]) -> T:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                async with self._pool.connection(timeout=self._pool_timeout_s) as conn, conn.transaction():
                    result = await self._run(conn, op())
            except _RACES as exc:
                if attempt == ATTEMPTS:
                    raise _translate_write(exc) from None
                await anyio.sleep(0.001 * attempt)
                continue
            except (psycopg.Error, PoolTimeout) as exc:
                raise _translate_write(exc) from None
            self._transactions += 1
            return result
        raise AssertionError("unreachable")

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        self._enter()
        try:
            with anyio.CancelScope(shield=True):
                result = await self._read_once(op, snapshot)
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError("the store could not be read", detail=type(exc).__name__) from None
        finally:
            self._leave()
        return result

    async def _read_once(self, op: OpFactory[T], snapshot: bool) -> T:
        async with self._pool.connection(timeout=self._pool_timeout_s) as conn:
            if not snapshot:
                return await self._run(conn, op())
            async with conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                return await self._run(conn, op())

    async def _run(self, conn: psycopg.AsyncConnection[Any], op: Op[T]) -> T:
        """Drive one operation (``store/statements.py``) on ``conn``, inside the caller's transaction."""
        try:
            stmt = next(op)
            while True:
                self._statements += 1
                cursor = await conn.execute(_postgres_sql(stmt.sql, stmt.lock), stmt.params)
                result: Any
                if stmt.fetch is Fetch.ONE:
                    result = await cursor.fetchone()
                elif stmt.fetch is Fetch.ALL:
                    result = await cursor.fetchall()
                elif stmt.fetch is Fetch.COUNT:
                    result = cursor.rowcount
                else:
                    result = None
                stmt = op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()

    def _enter(self) -> None:
        if self._closed:
            raise StoreError("store is closed")
        self._running += 1
        self._idle = anyio.Event() if self._running == 1 else self._idle

    def _leave(self) -> None:
        self._running -= 1
        if self._running == 0:
            self._idle.set()


def _conforms(store: PostgresStore) -> Store:
    """Let mypy check that the engine implements the whole contract."""
    return store


@functools.lru_cache(maxsize=512)
def _postgres_sql(sql: str, lock: str) -> str:
    """The shared SQL in psycopg's form: ``%s`` placeholders, the row-lock clause appended."""
    text = sql.replace("%", "%%").replace("?", "%s")
    return f"{text} {lock}" if lock else text


def _translate_write(exc: BaseException) -> StoreError:
    if isinstance(exc, psycopg.IntegrityError):
        return Conflict("the write violates a store constraint", detail=type(exc).__name__)
    return NotDurable("the write could not be made durable", detail=type(exc).__name__)


async def apply_migrations(conn: psycopg.AsyncConnection[Any], *, target: int | None = None) -> int:
    """Bring the database of ``conn`` to schema ``target`` (default: the newest) and return its version.

    One transaction under ``pg_advisory_xact_lock``: concurrent migrators take
    turns, and the later ones find the work done. Never downgrades; raises
    :class:`StoreError` for a database newer than this code.
    """
    latest = len(POSTGRES_MIGRATIONS) if target is None else target
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), version INTEGER NOT NULL)"
        )
        cursor = await conn.execute("SELECT version FROM schema_version")
        row = await cursor.fetchone()
        current = 0 if row is None else int(row[0])
        if current > len(POSTGRES_MIGRATIONS):
            raise StoreError(
                "the database has a newer schema than this code",
                database_version=current,
                code_version=len(POSTGRES_MIGRATIONS),
            )
        for migration in POSTGRES_MIGRATIONS[current:latest]:
            for statement in migration.statements:
                await conn.execute(statement)
        reached = max(current, latest)
        await conn.execute(
            "INSERT INTO schema_version (singleton, version) VALUES (1, %s)"
            " ON CONFLICT (singleton) DO UPDATE SET version = excluded.version",
            (reached,),
        )
    return reached
