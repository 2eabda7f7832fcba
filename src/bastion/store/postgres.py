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

The driver is asyncpg (issue #13): a governed call costs about 14 statements
on this engine, and asyncpg spends less than half the client CPU per round trip
that psycopg's async API did. Statements are prepared once per connection and
cached (``statement_cache_size``).
"""

from __future__ import annotations

import functools
import re
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import asyncpg
from asyncpg.pool import PoolConnectionProxy

from bastion.errors import Conflict, NotDurable, StoreError
from bastion.store.base import Store
from bastion.store.commit_stats import COMMIT_BUCKETS, CountHistogram, TimedCommit
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
    asyncpg.UniqueViolationError,
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
)
_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
"""What the driver raises: a server error, a dead or misused connection, a socket, a timeout.

``InternalClientError`` ("another operation is in progress") was seen on a pooled connection
that the server had terminated (issue #23): a storage failure like the others, never a crash."""
_Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
_STATEMENT_CACHE = 256  # prepared statements kept per connection (the ops have about a hundred)


class PostgresStore(StoreOperations):
    """The store on one PostgreSQL database. Build it with :meth:`connect`; end it with :meth:`aclose`."""

    def __init__(self, pool: asyncpg.Pool, *, target: _Target, redacted: str, pool_timeout_s: float) -> None:
        """Private: use :meth:`connect`."""
        self._pool = pool
        self._target = target
        self._redacted = redacted
        self._pool_timeout_s = pool_timeout_s
        self._closed = False
        self._running = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._transactions = 0
        self._statements = 0
        #: Seconds per write transaction's COMMIT (``metrics.py``; no group commit here).
        self.commit_seconds = CountHistogram(COMMIT_BUCKETS)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        # No floor: asyncpg restores one with a warning and a traceback per failed try, a
        # second log in an outage (issue #23 point 5); an idle connection is kept all the same.
        min_size: int = 0,
        max_size: int = 10,
        pool_timeout_s: float = 10.0,
        statement_timeout_s: float = 30.0,
    ) -> PostgresStore:
        """Connect to the database at ``dsn`` (a ``postgresql://`` URL) and migrate it.

        Raises :class:`StoreError` (naming the URL without its password) when the
        server cannot be reached or the database has a schema newer than this code.
        """
        redacted = redact_dsn(dsn)
        timeout_ms = str(int(statement_timeout_s * 1000))
        try:
            target = _Target.of(dsn, connect_timeout_s=pool_timeout_s)
        except ValueError:
            raise StoreError("the PostgreSQL store URL is malformed", store=redacted) from None
        # Set per connection at its start, so the URL's own ``options`` (a search_path, say) stay as given.
        settings = {"statement_timeout": timeout_ms, "lock_timeout": timeout_ms}
        pool: asyncpg.Pool | None = None
        try:
            with anyio.fail_after(pool_timeout_s):
                pool = await asyncpg.create_pool(
                    **target.connect_args("bastion", settings),
                    min_size=min_size,
                    max_size=max_size,
                    statement_cache_size=_STATEMENT_CACHE,
                    reset=_session_unchanged,
                )
            async with pool.acquire(timeout=pool_timeout_s) as conn:
                await apply_migrations(conn)
        except StoreError:
            await _close_pool(pool)
            raise
        except _DRIVER_ERRORS as exc:
            await _close_pool(pool)
            raise StoreError(
                "cannot open the PostgreSQL store",
                store=redacted,
                detail=_error_name(exc),
                cause=postgres_cause(exc),
            ) from None
        except BaseException:
            await _close_pool(pool)
            raise
        assert pool is not None
        return cls(pool, target=target, redacted=redacted, pool_timeout_s=pool_timeout_s)

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

    async def connect_alone(self, application_name: str) -> asyncpg.Connection:
        """A connection of its own (none of the pool's) to this database: the change feed's listener."""
        return await asyncpg.connect(**self._target.connect_args(application_name, {}))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(30):
            await self._idle.wait()
        await _close_pool(self._pool)

    async def probe(self, timeout_s: float) -> None:
        """One ``SELECT`` on a pooled connection; asyncpg bounds the wait for a connection and the query
        by ``timeout_s`` each. Shielded like every read: a cancelled probe never leaves a
        connection mid-query in the pool."""
        self._enter()
        try:
            with anyio.CancelScope(shield=True):
                async with self._pool.acquire(timeout=timeout_s) as conn:
                    await conn.fetchval("SELECT version FROM schema_version", timeout=timeout_s)
        except _DRIVER_ERRORS as exc:
            raise StoreError(
                "the store could not be read", detail=_error_name(exc), cause=postgres_cause(exc)
            ) from None
        finally:
            self._leave()

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
                async with (
                    self._pool.acquire(timeout=self._pool_timeout_s) as conn,
                    TimedCommit(conn.transaction(), self.commit_seconds),
                ):
                    result = await self._run(conn, op())
            except _RACES as exc:
                if attempt == ATTEMPTS:
                    raise _translate_write(exc) from None
                await anyio.sleep(0.001 * attempt)
                continue
            except _DRIVER_ERRORS as exc:
                raise _translate_write(exc) from None
            self._transactions += 1
            return result
        raise AssertionError("unreachable")

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        self._enter()
        try:
            with anyio.CancelScope(shield=True):
                result = await self._read_once(op, snapshot)
        except _DRIVER_ERRORS as exc:
            raise StoreError(
                "the store could not be read", detail=_error_name(exc), cause=postgres_cause(exc)
            ) from None
        finally:
            self._leave()
        return result

    async def _read_once(self, op: OpFactory[T], snapshot: bool) -> T:
        async with self._pool.acquire(timeout=self._pool_timeout_s) as conn:
            if not snapshot:
                return await self._run(conn, op())
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await self._run(conn, op())

    async def _run(self, conn: _Connection, op: Op[T]) -> T:
        """Drive one operation (``store/statements.py``) on ``conn``, inside the caller's transaction."""
        try:
            stmt = next(op)
            while True:
                self._statements += 1
                sql = _postgres_sql(stmt.sql, stmt.lock)
                result: Any
                if stmt.fetch is Fetch.ONE:
                    result = await conn.fetchrow(sql, *stmt.params)
                elif stmt.fetch is Fetch.ALL:
                    result = await conn.fetch(sql, *stmt.params)
                elif stmt.fetch is Fetch.COUNT:
                    result = _changed_rows(await conn.execute(sql, *stmt.params))
                else:
                    await conn.execute(sql, *stmt.params)
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


class _Target:
    """Where to connect, as asyncpg takes it: the URL, less the libpq parameters asyncpg would misread.

    asyncpg reads the URL's host, port, user, password, database and ``ssl*``
    parameters itself and sends any other query parameter to the server as a
    setting (``options`` included, as libpq does). ``connect_timeout`` is libpq's
    own, not a server setting: it is taken out here and bounds each connect.
    """

    def __init__(self, url: str, connect_timeout_s: float) -> None:
        self.url = url
        self.connect_timeout_s = connect_timeout_s

    @classmethod
    def of(cls, dsn: str, *, connect_timeout_s: float) -> _Target:
        parts = urlsplit(dsn)
        query = parse_qsl(parts.query, keep_blank_values=True)
        kept = [(key, value) for key, value in query if key != "connect_timeout"]
        for key, value in query:
            if key == "connect_timeout":
                connect_timeout_s = float(value) if float(value) > 0 else connect_timeout_s
        url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept, safe="/"), ""))
        return cls(url, connect_timeout_s)

    def connect_args(self, application_name: str, settings: dict[str, str]) -> dict[str, Any]:
        return {
            "dsn": self.url,
            "timeout": self.connect_timeout_s,
            "server_settings": {"application_name": application_name, **settings},
        }


async def _session_unchanged(conn: asyncpg.Connection) -> None:
    """The pool's reset: none. Nothing here changes a session (no ``SET``, ``LISTEN`` or session
    lock; transactions are always ended), and asyncpg still rolls back an open one on release,
    so the default ``RESET ALL``/``UNLISTEN *`` round trip per checkout would do nothing."""


async def _close_pool(pool: asyncpg.Pool | None) -> None:
    if pool is None:
        return
    with anyio.move_on_after(10):
        await pool.close()
        return
    pool.terminate()


def _conforms(store: PostgresStore) -> Store:
    """Let mypy check that the engine implements the whole contract."""
    return store


@functools.lru_cache(maxsize=512)
def _postgres_sql(sql: str, lock: str) -> str:
    """The shared SQL in PostgreSQL's form: ``$1, $2, ...`` placeholders, the row-lock clause appended."""
    numbers = iter(range(1, sql.count("?") + 1))
    text = re.sub(r"\?", lambda _: f"${next(numbers)}", sql)
    return f"{text} {lock}" if lock else text


def _changed_rows(status: str) -> int:
    """The row count of a command's status (``UPDATE 3``, ``INSERT 0 1``, ``DELETE 0``)."""
    return int(status.rsplit(" ", 1)[-1])


def _error_name(exc: BaseException) -> str:
    """The driver error's name for ``detail``: a server error is its condition's name (``UndefinedTable``)."""
    name = type(exc).__name__
    return (
        name[: -len("Error")] if isinstance(exc, asyncpg.PostgresError) and name.endswith("Error") else name
    )


def _translate_write(exc: BaseException) -> StoreError:
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        return Conflict("the write violates a store constraint", detail=_error_name(exc))
    return NotDurable(
        "the write could not be made durable", detail=_error_name(exc), cause=postgres_cause(exc)
    )


def postgres_cause(exc: BaseException) -> str | None:
    """What an operator should read about a driver error (issue #23 point 4); never a secret.

    The distinguishable causes are named; any other is ``None`` (``detail`` keeps its name).
    """
    if isinstance(exc, asyncpg.InvalidPasswordError):
        return "authentication refused by PostgreSQL (password rejected)"
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        return "authentication refused by PostgreSQL (role or connection not authorized)"
    if isinstance(exc, asyncpg.DiskFullError):
        return "disk full at the PostgreSQL server"
    if isinstance(exc, asyncpg.OperatorInterventionError):  # shutting down, or not yet accepting
        return "PostgreSQL is shutting down or starting up"
    if isinstance(exc, ConnectionRefusedError | FileNotFoundError):
        return "connection refused: PostgreSQL is not listening"
    if isinstance(exc, asyncpg.ConnectionDoesNotExistError | ConnectionError | asyncpg.InterfaceError):
        return "the connection to PostgreSQL was lost"
    if isinstance(exc, TimeoutError):
        return "PostgreSQL did not answer in time"
    return None


async def apply_migrations(conn: _Connection, *, target: int | None = None) -> int:
    """Bring the database of ``conn`` to schema ``target`` (default: the newest) and return its version.

    One transaction under ``pg_advisory_xact_lock``: concurrent migrators take
    turns, and the later ones find the work done. Never downgrades; raises
    :class:`StoreError` for a database newer than this code.
    """
    latest = len(POSTGRES_MIGRATIONS) if target is None else target
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), version INTEGER NOT NULL)"
        )
        row = await conn.fetchrow("SELECT version FROM schema_version")
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
            "INSERT INTO schema_version (singleton, version) VALUES (1, $1)"
            " ON CONFLICT (singleton) DO UPDATE SET version = excluded.version",
            reached,
        )
    return reached
