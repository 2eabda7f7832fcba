"""The SQLite engine of the store contract (DESIGN section 7): the embedded default.

What it guarantees, and how:

- **Durable.** WAL journal with ``synchronous=FULL``: a write returns only
  after its transaction's commit reached the disk.
- **Atomic, across processes.** Every write runs inside ``BEGIN IMMEDIATE``,
  which takes the file's write lock before the first read, so a
  read-classify-write (a reservation, a chain append, a fence check) sees no
  other writer, in this process or another. Waiting for the lock is bounded
  by ``busy_timeout``; past it the write raises :class:`NotDurable`.
- **Group commit.** One writer connection per store, owned by one writer
  thread of this store. Writes queue; the writer takes every queued write (up
  to ``max_batch``) and runs them in one transaction, each keeping its own
  atomicity and its own error, and the batch pays one fsync. The batch runs
  first without savepoints; only if a write raises is it rolled back and run
  again with a savepoint per write (two statements per write saved on the
  common path). If the commit fails, every write of the batch raises
  :class:`NotDurable`, refusals included (a refusal may rest on a write of the
  same batch that never became durable). A caller learns its result through
  one loop wake-up per batch (no worker-thread hand-off per write).
- **Concurrent reads.** Reads use a small pool of read-only connections and
  see only committed data.
- **Versioned schema.** ``store/migrations/`` is applied at open under the
  write lock; a file newer than this code is refused.

Blocking calls run off the event loop: writes on the store's writer thread,
reads on worker threads (``anyio.to_thread``). This module must never hold
process-global state: two stores may share one file in one process, as two
replicas would (each store has its own writer thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread

from bastion.errors import Conflict, NotDurable, StoreError
from bastion.store.base import Store
from bastion.store.commit_stats import BATCH_BUCKETS, COMMIT_BUCKETS, CountHistogram
from bastion.store.migrations import SQLITE_MIGRATIONS
from bastion.store.operations import StoreOperations
from bastion.store.statements import Fetch, Op, OpFactory

__all__ = ["SqliteStore", "apply_migrations"]

T = TypeVar("T")


class SqliteStore(StoreOperations):
    """The store on one SQLite file. Build it with :meth:`open`; end it with :meth:`aclose`."""

    def __init__(
        self, path: str, writer: sqlite3.Connection, *, max_batch: int, busy_timeout_s: float
    ) -> None:
        """Private: use :meth:`open`."""
        self._path = path
        self._writer = writer
        self._max_batch = max_batch
        self._busy_timeout_s = busy_timeout_s
        # Guards _pending and each job's taken/withdrawn flags, between the loop and the writer.
        self._queue_lock = threading.Lock()
        self._pending: list[_Job[Any]] = []
        # Held by the writer while it takes and runs a batch (tests hold it to shape a batch).
        self._batch_lock = threading.Lock()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        # True from a wake-up until the writer finds the queue empty: a write queued meanwhile
        # is taken by the writer's next round, without waking it (no futex call per write).
        self._writer_busy = False
        self._thread = threading.Thread(target=self._writer_loop, name="bastion-sqlite-writer", daemon=True)
        self._idle_readers: list[sqlite3.Connection] = []
        self._closed = False
        self._transactions = 0
        self._writes = 0
        self._statements = 0
        #: Seconds per COMMIT (its fsync) and writes per committed batch (``metrics.py``).
        self.commit_seconds = CountHistogram(COMMIT_BUCKETS)
        self.batch_sizes = CountHistogram(BATCH_BUCKETS)
        self._thread.start()

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, max_batch: int = 256, busy_timeout_s: float = 10.0
    ) -> SqliteStore:
        """Open (creating if needed) and migrate the store at ``path``.

        ``max_batch=1`` turns group commit off. Raises :class:`StoreError` when
        the file cannot be opened in WAL mode or has a schema newer than this code.
        """
        filename = os.fspath(path)
        if filename == ":memory:" or filename.startswith("file:"):
            raise ValueError("SqliteStore needs a file path that several connections can share")
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")

        def prepare() -> sqlite3.Connection:
            conn = _connect(filename, busy_timeout_s)
            try:
                # Switching a fresh file to WAL can answer "locked" at once, without
                # SQLite's busy handler, while another process switches it: retry,
                # bounded by the same timeout.
                mode = _retry_locked(
                    lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0], busy_timeout_s
                )
                if str(mode).lower() != "wal":
                    raise StoreError("the store file cannot use WAL journaling", journal_mode=str(mode))
                conn.execute("PRAGMA synchronous = FULL")
                _retry_locked(lambda: apply_migrations(conn), busy_timeout_s)
            except BaseException as exc:
                conn.close()
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(
                        f"cannot open the store file {filename}",
                        detail=f"{type(exc).__name__}: {exc}",
                        cause=sqlite_cause(exc),
                    ) from exc
                raise
            return conn

        writer = await anyio.to_thread.run_sync(prepare)
        return cls(filename, writer, max_batch=max_batch, busy_timeout_s=busy_timeout_s)

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def committed_transactions(self) -> int:
        """Write transactions committed so far (one fsync each)."""
        return self._transactions

    @property
    def statements_run(self) -> int:
        """Statements sent so far, reads and writes (for the bench)."""
        return self._statements

    def _count_statement(self) -> None:
        self._statements += 1  # approximate under concurrent reader threads: a bench figure only

    @property
    def committed_writes(self) -> int:
        """Writes that were part of a committed transaction, refusals included."""
        return self._writes

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.put(None)
        # The writer ends the batch it runs, fails what is still queued, closes its connection.
        await anyio.to_thread.run_sync(self._thread.join)
        while self._idle_readers:
            self._idle_readers.pop().close()

    # ------------------------------------------------------------ the engine

    async def _write(self, op: OpFactory[T]) -> T:
        loop = asyncio.get_running_loop()
        job: _Job[T] = _Job(lambda conn: run_op(conn, op(), self._count_statement), loop)
        with self._queue_lock:
            if self._closed:
                raise StoreError("store is closed")
            self._pending.append(job)
            wake = not self._writer_busy
            self._writer_busy = True
        if wake:
            self._wake.put(None)
        try:
            await job.future
        except BaseException:
            with self._queue_lock:
                # Not yet taken into a batch: withdraw it, so a cancelled write never happens.
                # Once taken, it runs to its end whether or not anybody waits for it.
                if not job.taken and job in self._pending:
                    self._pending.remove(job)
            raise
        return job.result()

    def _writer_loop(self) -> None:
        """The writer thread: run queued writes in batches until the store closes."""
        while True:
            self._wake.get()
            while True:
                with self._batch_lock:
                    with self._queue_lock:
                        if self._closed:
                            _fail_all(self._pending, StoreError("store is closed"))
                            _settle(self._pending)
                            self._pending.clear()
                            self._writer.close()
                            return
                        batch = self._pending[: self._max_batch]
                        del self._pending[: len(batch)]
                        for queued in batch:
                            queued.taken = True
                        if not batch:
                            self._writer_busy = False
                    if not batch:
                        break
                    try:
                        self._run_batch(batch)
                    finally:
                        _settle(batch)

    def _run_batch(self, batch: list[_Job[Any]]) -> None:
        """One transaction for the batch, one fsync at its commit.

        Each write's failure is its own: the batch first runs without savepoints (two
        statements less per write); if a write raises, the transaction is rolled back and the
        batch runs again with a savepoint per write, so the others still commit.
        """
        conn = self._writer
        try:
            _retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"), self._busy_timeout_s)
        except sqlite3.Error as exc:
            _fail_all(
                batch,
                NotDurable(
                    "the store is busy or unwritable", detail=type(exc).__name__, cause=sqlite_cause(exc)
                ),
            )
            return
        try:
            if not _run_plain(conn, batch):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                _retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"), self._busy_timeout_s)
                _run_isolated(conn, batch)
            committing = time.perf_counter()
            conn.execute("COMMIT")
            self.commit_seconds.observe(time.perf_counter() - committing)
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            _fail_all(
                batch,
                NotDurable(
                    "the write could not be made durable", detail=type(exc).__name__, cause=sqlite_cause(exc)
                ),
            )
            return
        self._transactions += 1
        self._writes += len(batch)
        self.batch_sizes.observe(len(batch))

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        if self._closed:
            raise StoreError("store is closed")
        conn = self._idle_readers.pop() if self._idle_readers else None

        def run() -> T:
            nonlocal conn
            if conn is None:
                conn = _connect(self._path, self._busy_timeout_s)
                conn.execute("PRAGMA query_only = ON")
            if snapshot:
                return _in_read_transaction(conn, op(), self._count_statement)
            return run_op(conn, op(), self._count_statement)

        try:
            return await anyio.to_thread.run_sync(run)
        except sqlite3.Error as exc:
            raise StoreError(
                f"the store file {self._path} could not be read",
                detail=type(exc).__name__,
                cause=sqlite_cause(exc),
            ) from exc
        finally:
            if conn is not None:
                if self._closed:
                    conn.close()
                else:
                    self._idle_readers.append(conn)


def _conforms(store: SqliteStore) -> Store:
    """Let mypy check that the engine implements the whole contract."""
    return store


# ---------------------------------------------------------------- schema


def apply_migrations(conn: sqlite3.Connection, *, target: int | None = None) -> int:
    """Bring the file of ``conn`` to schema ``target`` (default: the newest) and return its version.

    Runs under ``BEGIN IMMEDIATE``, so concurrent openers migrate once. Never
    downgrades; raises :class:`StoreError` for a file newer than this code.
    """
    latest = len(SQLITE_MIGRATIONS) if target is None else target
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), version INTEGER NOT NULL)"
        )
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        current = 0 if row is None else int(row[0])
        if current > len(SQLITE_MIGRATIONS):
            raise StoreError(
                "the store file has a newer schema than this code",
                file_version=current,
                code_version=len(SQLITE_MIGRATIONS),
            )
        for migration in SQLITE_MIGRATIONS[current:latest]:
            for statement in migration.statements:
                conn.execute(statement)
        reached = max(current, latest)
        conn.execute(
            "INSERT INTO schema_version (singleton, version) VALUES (1, ?)"
            " ON CONFLICT (singleton) DO UPDATE SET version = excluded.version",
            (reached,),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return reached


# ---------------------------------------------------------------- helpers (writer's or a reader's thread)


class _Unset:
    pass


_UNSET = _Unset()


class _Job(Generic[T]):
    """One queued write: its operation, then its result or its own error."""

    __slots__ = ("error", "future", "loop", "op", "taken", "value")

    def __init__(self, op: Callable[[sqlite3.Connection], T], loop: asyncio.AbstractEventLoop) -> None:
        self.op = op
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.taken = False
        self.value: T | _Unset = _UNSET
        self.error: BaseException | None = None

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        assert not isinstance(self.value, _Unset)
        return self.value


def _settle(jobs: list[_Job[Any]]) -> None:
    """From the writer thread: wake each job's caller, one loop wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Job[Any]]] = {}
    for job in jobs:
        by_loop.setdefault(job.loop, []).append(job)
    for loop, waiting in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_wake_callers, waiting)


def _wake_callers(jobs: list[_Job[Any]]) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_result(None)


def _fail_all(jobs: list[_Job[Any]], error: StoreError) -> None:
    for job in jobs:
        job.value = _UNSET
        job.error = error


def _translate(exc: Exception) -> BaseException:
    if isinstance(exc, sqlite3.IntegrityError):
        return Conflict("the write violates a store constraint", detail=type(exc).__name__)
    if isinstance(exc, sqlite3.Error):
        return NotDurable(
            "the write could not be made durable", detail=type(exc).__name__, cause=sqlite_cause(exc)
        )
    return exc


def _run_plain(conn: sqlite3.Connection, batch: list[_Job[Any]]) -> bool:
    """Every write of the batch in the open transaction; False at the first that raises."""
    for job in batch:
        try:
            job.value = job.op(conn)
        except Exception:
            return False
    return True


def _run_isolated(conn: sqlite3.Connection, batch: list[_Job[Any]]) -> None:
    """Every write of the batch in its own savepoint: a failed write is undone alone and keeps its error."""
    for job in batch:
        job.value, job.error = _UNSET, None
        conn.execute("SAVEPOINT op")
        try:
            job.value = job.op(conn)
        except Exception as exc:
            if not conn.in_transaction:
                # SQLite rolled the whole transaction back (I/O error, disk full).
                raise
            conn.execute("ROLLBACK TO op")
            job.error = _translate(exc)
        conn.execute("RELEASE op")


def _retry_locked(attempt: Callable[[], T], timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def sqlite_cause(exc: BaseException) -> str | None:
    """What an operator should read about a SQLite error (issue #23 point 4), or ``None``."""
    text = str(exc).lower()
    for needle, cause in (
        ("disk is full", "disk full (the store file's filesystem has no room)"),
        ("disk i/o error", "I/O error on the store file"),
        ("locked", "the store file is locked by another process"),
        ("readonly", "the store file is read-only"),
        ("unable to open", "the store file cannot be opened"),
        ("not a database", "the store file is not a SQLite database (damaged)"),
        ("malformed", "the store file is damaged"),
    ):
        if needle in text:
            return cause
    return None


def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def run_op(conn: sqlite3.Connection, op: Op[T], counted: Callable[[], None] | None = None) -> T:
    """Drive one operation (``store/statements.py``) on ``conn``; row locks are SQLite's file lock."""
    try:
        stmt = next(op)
        while True:
            if counted is not None:
                counted()
            cursor = conn.execute(stmt.sql, stmt.params)
            result: Any
            if stmt.fetch is Fetch.ONE:
                result = cursor.fetchone()
            elif stmt.fetch is Fetch.ALL:
                result = cursor.fetchall()
            elif stmt.fetch is Fetch.COUNT:
                result = cursor.rowcount
            else:
                result = None
            stmt = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        op.close()


def _in_read_transaction(conn: sqlite3.Connection, op: Op[T], counted: Callable[[], None]) -> T:
    """Run ``op`` in one read transaction (one snapshot of the WAL), so related rows agree."""
    conn.execute("BEGIN")
    try:
        return run_op(conn, op, counted)
    finally:
        conn.execute("COMMIT")
