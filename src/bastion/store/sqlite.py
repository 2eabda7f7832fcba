"""The SQLite engine of the store contract (DESIGN section 7): the embedded default.

What it guarantees, and how:

- **Durable.** WAL journal with ``synchronous=FULL``: a write returns only
  after its transaction's commit reached the disk.
- **Atomic, across processes.** Every write runs inside ``BEGIN IMMEDIATE``,
  which takes the file's write lock before the first read, so a
  read-classify-write (a reservation, a chain append, a fence check) sees no
  other writer, in this process or another. Waiting for the lock is bounded
  by ``busy_timeout``; past it the write raises :class:`NotDurable`.
- **Group commit.** One writer connection per store, used by one batch at a
  time. Writes queue; whichever caller finds the writer free takes every
  queued write (up to ``max_batch``) and runs them in one transaction, each
  inside its own savepoint, so each keeps its own atomicity and its own error,
  and the batch pays one fsync. If the commit fails, every write of the batch
  raises :class:`NotDurable`, refusals included (a refusal may rest on a write
  of the same batch that never became durable).
- **Concurrent reads.** Reads use a small pool of read-only connections and
  see only committed data.
- **Versioned schema.** ``store/migrations/`` is applied at open under the
  write lock; a file newer than this code is refused.

Blocking calls run on worker threads (``anyio.to_thread``), never on the event
loop. This module must never hold process-global state: two stores may share
one file in one process, as two replicas would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
import orjson

from bastion.admission.states import ExecutionState, check_transition
from bastion.audit.entry import GENESIS_PREV, AuditEntry
from bastion.errors import (
    AgentSessionExpired,
    AgentSessionRevoked,
    Conflict,
    ExecutionCollision,
    ExecutionInFlight,
    ExecutionReplay,
    NotDurable,
    StaleEpoch,
    StoreError,
)
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.base import (
    AgentSessionRecord,
    AppendBuilder,
    AttachmentRecord,
    ChainInfo,
    CredentialKind,
    CredentialRecord,
    ExecutionRecord,
    GenerationBacklog,
    GenerationRecord,
    Readmitted,
    RecoveredExecution,
    Reserved,
    ReserveOutcome,
    Store,
    WorkerRecord,
)
from bastion.store.migrations import SQLITE_MIGRATIONS
from bastion.store.replicas_sqlite import SqliteReplicaRecords

__all__ = ["SqliteStore", "apply_migrations"]

T = TypeVar("T")
_EPOCH_ZERO = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_BINDING_RULE = re.compile(r"[0-9a-f]{64}")
_DIGEST_RULE = _BINDING_RULE


class SqliteStore(SqliteReplicaRecords):
    """The store on one SQLite file. Build it with :meth:`open`; end it with :meth:`aclose`."""

    def __init__(
        self, path: str, writer: sqlite3.Connection, *, max_batch: int, busy_timeout_s: float
    ) -> None:
        """Private: use :meth:`open`."""
        self._path = path
        self._writer = writer
        self._max_batch = max_batch
        self._busy_timeout_s = busy_timeout_s
        self._write_lock = anyio.Lock()
        self._pending: list[_Job[Any]] = []
        self._idle_readers: list[sqlite3.Connection] = []
        self._closed = False
        self._transactions = 0
        self._writes = 0

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
                    raise StoreError("cannot open the store file", detail=type(exc).__name__) from exc
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
    def committed_writes(self) -> int:
        """Writes that were part of a committed transaction, refusals included."""
        return self._writes

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._write_lock:
            _fail_all(self._pending, StoreError("store is closed"))
            self._pending.clear()
            self._writer.close()
        while self._idle_readers:
            self._idle_readers.pop().close()

    # ------------------------------------------------------------ the engine

    async def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError("store is closed")
        job: _Job[T] = _Job(op)
        self._pending.append(job)
        try:
            while not job.done:
                async with self._write_lock:
                    if job.done:
                        break
                    if self._closed:
                        _fail_all(self._pending, StoreError("store is closed"))
                        self._pending.clear()
                        break
                    batch = self._pending[: self._max_batch]
                    del self._pending[: len(batch)]
                    for queued in batch:
                        queued.taken = True
                    # Shielded: a batch, once taken, runs to its end, so no
                    # queued caller waits on a write that nobody will run.
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._run_batch, batch)
        except BaseException:
            # Not yet taken into a batch: withdraw it, so a cancelled write never happens.
            if not job.taken and job in self._pending:
                self._pending.remove(job)
            raise
        return job.result()

    def _run_batch(self, batch: list[_Job[Any]]) -> None:
        conn = self._writer
        try:
            _retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"), self._busy_timeout_s)
        except sqlite3.Error as exc:
            _fail_all(batch, NotDurable("the store is busy or unwritable", detail=type(exc).__name__))
            return
        try:
            for job in batch:
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
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            _fail_all(batch, NotDurable("the write could not be made durable", detail=type(exc).__name__))
            if not isinstance(exc, Exception):
                raise
            return
        self._transactions += 1
        self._writes += len(batch)
        for job in batch:
            job.done = True

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError("store is closed")
        conn = self._idle_readers.pop() if self._idle_readers else None

        def run() -> T:
            nonlocal conn
            if conn is None:
                conn = _connect(self._path, self._busy_timeout_s)
                conn.execute("PRAGMA query_only = ON")
            return op(conn)

        try:
            return await anyio.to_thread.run_sync(run)
        except sqlite3.Error as exc:
            raise StoreError("the store could not be read", detail=type(exc).__name__) from exc
        finally:
            if conn is not None:
                if self._closed:
                    conn.close()
                else:
                    self._idle_readers.append(conn)

    # ------------------------------------------------------------ workers and fencing

    async def register_worker(
        self, worker_id: WorkerId, role: str, provenance: Mapping[str, Any], *, now: datetime
    ) -> WorkerRecord:
        provenance_json = _dumps(provenance)
        now_us = _to_us(now)

        def op(conn: sqlite3.Connection) -> WorkerRecord:
            if conn.execute("SELECT 1 FROM workers WHERE worker_id = ?", (worker_id,)).fetchone():
                raise Conflict("worker identity already registered", worker=worker_id)
            conn.execute(
                "INSERT INTO workers (worker_id, role, provenance, registered_at, heartbeat_at, generation)"
                " VALUES (?, ?, ?, ?, ?, NULL)",
                (worker_id, role, provenance_json, now_us, now_us),
            )
            return _select_worker(conn, worker_id)  # type: ignore[return-value]

        return await self._write(op)

    async def claim_generation(
        self, generation: str, worker_id: WorkerId, *, now: datetime, lease_s: float
    ) -> Epoch:
        now_us = _to_us(now)
        if not lease_s > 0:
            raise ValueError("lease_s must be positive")
        lease_us = int(lease_s * 1_000_000)

        def op(conn: sqlite3.Connection) -> Epoch:
            claimant = conn.execute(
                "SELECT generation, withdrawn_at IS NOT NULL OR failed_at IS NOT NULL FROM workers"
                " WHERE worker_id = ?",
                (worker_id,),
            ).fetchone()
            if claimant is None:
                raise Conflict("unknown worker", worker=worker_id)
            if claimant[0] is not None and claimant[0] != generation:
                raise Conflict("worker already holds another generation", worker=worker_id)
            if claimant[1]:
                raise Conflict("worker liveness was withdrawn or it failed", worker=worker_id)
            held = conn.execute(
                "SELECT g.epoch, w.heartbeat_at, w.withdrawn_at IS NOT NULL OR w.failed_at IS NOT NULL"
                " FROM generations AS g JOIN workers AS w ON w.worker_id = g.holder WHERE g.generation = ?",
                (generation,),
            ).fetchone()
            if held is None:
                epoch = 1
                conn.execute(
                    "INSERT INTO generations (generation, holder, epoch, claimed_at) VALUES (?, ?, 1, ?)",
                    (generation, worker_id, now_us),
                )
            else:
                if not held[2] and now_us - held[1] < lease_us:
                    raise Conflict("generation is held by a live worker", generation=generation)
                epoch = held[0] + 1
                conn.execute(
                    "UPDATE generations SET holder = ?, epoch = ?, claimed_at = ? WHERE generation = ?",
                    (worker_id, epoch, now_us, generation),
                )
            conn.execute(
                "UPDATE workers SET generation = ?, claimed_epoch = ?, heartbeat_at = MAX(heartbeat_at, ?)"
                " WHERE worker_id = ?",
                (generation, epoch, now_us, worker_id),
            )
            return Epoch(epoch)

        return await self._write(op)

    async def heartbeat(self, worker_id: WorkerId, now: datetime) -> None:
        now_us = _to_us(now)

        def op(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT w.generation, g.holder, w.withdrawn_at IS NOT NULL OR w.failed_at IS NOT NULL"
                " FROM workers AS w LEFT JOIN generations AS g ON g.generation = w.generation"
                " WHERE w.worker_id = ?",
                (worker_id,),
            ).fetchone()
            if row is None:
                raise Conflict("unknown worker", worker=worker_id)
            if row[0] is not None and row[1] != worker_id:
                raise StaleEpoch("worker was superseded in its generation", worker=worker_id)
            if row[2]:
                raise StaleEpoch("worker liveness was withdrawn or it failed", worker=worker_id)
            conn.execute(
                "UPDATE workers SET heartbeat_at = MAX(heartbeat_at, ?) WHERE worker_id = ?",
                (now_us, worker_id),
            )

        await self._write(op)

    async def get_worker(self, worker_id: WorkerId) -> WorkerRecord | None:
        return await self._read(lambda conn: _select_worker(conn, worker_id))

    async def get_generation(self, generation: str) -> GenerationRecord | None:
        def op(conn: sqlite3.Connection) -> GenerationRecord | None:
            row = conn.execute(
                "SELECT holder, epoch, claimed_at FROM generations WHERE generation = ?", (generation,)
            ).fetchone()
            if row is None:
                return None
            return GenerationRecord(generation, WorkerId(row[0]), Epoch(row[1]), _from_us(row[2]))

        return await self._read(op)

    # ------------------------------------------------------------ worker registry (issue #5)
    # Withdrawal and failure are unfenced: see store/base.py, "Worker registry".

    async def list_workers(self) -> list[WorkerRecord]:
        def op(conn: sqlite3.Connection) -> list[WorkerRecord]:
            rows = conn.execute(_SELECT_WORKER + " ORDER BY registered_at, worker_id").fetchall()
            return [_worker_from_row(row) for row in rows]

        return await self._read(op)

    async def list_generations(self) -> list[GenerationRecord]:
        def op(conn: sqlite3.Connection) -> list[GenerationRecord]:
            rows = conn.execute(
                "SELECT generation, holder, epoch, claimed_at FROM generations ORDER BY generation"
            ).fetchall()
            return [GenerationRecord(r[0], WorkerId(r[1]), Epoch(r[2]), _from_us(r[3])) for r in rows]

        return await self._read(op)

    async def withdraw_liveness(self, worker_id: WorkerId, *, now: datetime, reason: str) -> WorkerRecord:
        return await self._end_liveness(worker_id, _WITHDRAW_LIVENESS, reason, now)

    async def mark_worker_failed(self, worker_id: WorkerId, reason: str, now: datetime) -> WorkerRecord:
        return await self._end_liveness(worker_id, _MARK_FAILED, reason, now)

    async def _end_liveness(
        self, worker_id: WorkerId, update: str, reason: str, now: datetime
    ) -> WorkerRecord:
        if not reason:
            raise ValueError("ending a worker's liveness needs a reason")
        now_us = _to_us(now)

        def op(conn: sqlite3.Connection) -> WorkerRecord:
            # The first withdrawal (or failure) wins; a later one records nothing over it.
            conn.execute(update, (now_us, reason, worker_id))
            record = _select_worker(conn, worker_id)
            if record is None:
                raise Conflict("unknown worker", worker=worker_id)
            return record

        return await self._write(op)

    async def generation_backlog(self, generation: str) -> GenerationBacklog:
        def op(conn: sqlite3.Connection) -> GenerationBacklog:
            executions = conn.execute(
                "SELECT COUNT(*) FROM executions WHERE generation = ? AND state IN ('reserved', 'invoking')",
                (generation,),
            ).fetchone()[0]
            chains = conn.execute(
                "SELECT COUNT(*) FROM chains WHERE generation = ? AND closed = 0", (generation,)
            ).fetchone()[0]
            return GenerationBacklog(generation, int(executions), int(chains))

        return await self._read(lambda conn: _in_read_transaction(conn, op))

    async def record_attachment(
        self,
        worker_id: WorkerId,
        transport_session_ref: str,
        namespace: str,
        now: datetime,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> AttachmentRecord:
        if not transport_session_ref or not namespace:
            raise ValueError("an attachment names a transport session reference and a namespace")
        now_us = _to_us(now)

        def op(conn: sqlite3.Connection) -> AttachmentRecord:
            _fence(conn, writer, epoch)
            if not conn.execute("SELECT 1 FROM workers WHERE worker_id = ?", (worker_id,)).fetchone():
                raise Conflict("unknown worker", worker=worker_id)
            conn.execute(
                "INSERT INTO attachments (worker_id, transport_session_ref, namespace, attached_at, writer,"
                " epoch) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (worker_id, transport_session_ref, namespace) DO UPDATE SET"
                " attached_at = excluded.attached_at, writer = excluded.writer, epoch = excluded.epoch",
                (worker_id, transport_session_ref, namespace, now_us, writer, epoch),
            )
            return AttachmentRecord(worker_id, transport_session_ref, namespace, now, writer, epoch)

        return await self._write(op)

    async def clear_attachment(
        self,
        worker_id: WorkerId,
        transport_session_ref: str,
        namespace: str,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            _fence(conn, writer, epoch)
            cursor = conn.execute(
                "DELETE FROM attachments WHERE worker_id = ? AND transport_session_ref = ? AND namespace = ?",
                (worker_id, transport_session_ref, namespace),
            )
            return cursor.rowcount > 0

        return await self._write(op)

    async def list_attachments(
        self, worker_id: WorkerId | None = None, *, transport_session_ref: str | None = None
    ) -> list[AttachmentRecord]:
        def op(conn: sqlite3.Connection) -> list[AttachmentRecord]:
            rows = conn.execute(
                "SELECT worker_id, transport_session_ref, namespace, attached_at, writer, epoch"
                " FROM attachments WHERE (? IS NULL OR worker_id = ?)"
                " AND (? IS NULL OR transport_session_ref = ?)"
                " ORDER BY attached_at, worker_id, transport_session_ref, namespace",
                (worker_id, worker_id, transport_session_ref, transport_session_ref),
            ).fetchall()
            return [
                AttachmentRecord(WorkerId(r[0]), r[1], r[2], _from_us(r[3]), WorkerId(r[4]), Epoch(r[5]))
                for r in rows
            ]

        return await self._read(op)

    # ------------------------------------------------------------ executions

    async def reserve_execution(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        binding: str,
        *,
        call_id: CallId,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ReserveOutcome:
        if not _BINDING_RULE.fullmatch(binding):
            raise ValueError("binding must be the 64-digit lowercase SHA-256 hex of admission.binding")

        def op(conn: sqlite3.Connection) -> ReserveOutcome:
            generation = _fence(conn, worker, epoch)
            row = _select_execution(conn, agent, execution_id)
            if row is None:
                check_transition(None, ExecutionState.RESERVED)
                conn.execute(
                    "INSERT INTO executions (agent, execution_id, binding, state, call_id, generation,"
                    " worker, epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (agent, execution_id, binding, "reserved", call_id, generation, worker, epoch),
                )
                return Reserved(_select_execution(conn, agent, execution_id))  # type: ignore[arg-type]
            if row.binding != binding:
                raise ExecutionCollision(execution_id=execution_id)
            if row.state.is_terminal:
                raise ExecutionReplay(execution_id=execution_id, earlier_outcome=row.state.value)
            if row.state is not ExecutionState.RELEASED:
                raise ExecutionInFlight(execution_id=execution_id, state=row.state.value)
            check_transition(row.state, ExecutionState.RESERVED)
            conn.execute(
                "UPDATE executions SET state = ?, call_id = ?, generation = ?, worker = ?, epoch = ?"
                " WHERE agent = ? AND execution_id = ?",
                (ExecutionState.RESERVED, call_id, generation, worker, epoch, agent, execution_id),
            )
            return Readmitted(_select_execution(conn, agent, execution_id))  # type: ignore[arg-type]

        return await self._write(op)

    async def mark_invoking(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        return await self._write(
            lambda conn: _transition(conn, agent, execution_id, ExecutionState.INVOKING, worker, epoch)
        )

    async def record_outcome(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        outcome: ExecutionState,
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ExecutionRecord:
        if not outcome.is_terminal:
            raise ValueError(f"record_outcome needs a terminal state, not {outcome.value}")
        return await self._write(lambda conn: _transition(conn, agent, execution_id, outcome, worker, epoch))

    async def release_execution(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        return await self._write(
            lambda conn: _transition(conn, agent, execution_id, ExecutionState.RELEASED, worker, epoch)
        )

    async def get_execution(self, agent: AgentId, execution_id: ExecutionId) -> ExecutionRecord | None:
        return await self._read(lambda conn: _select_execution(conn, agent, execution_id))

    async def recover_worker(
        self, dead_worker_generation: str, *, new_worker: WorkerId, new_epoch: Epoch
    ) -> list[RecoveredExecution]:
        def op(conn: sqlite3.Connection) -> list[RecoveredExecution]:
            if _fence(conn, new_worker, new_epoch) != dead_worker_generation:
                raise Conflict("the recovering worker does not hold that generation")
            rows = conn.execute(
                "SELECT agent, execution_id, binding, state, call_id, worker, epoch FROM executions"
                " WHERE generation = ? AND state IN ('reserved', 'invoking') AND epoch < ?"
                " ORDER BY agent, execution_id",
                (dead_worker_generation, new_epoch),
            ).fetchall()
            recovered = []
            for agent, execution_id, binding, state, call_id, worker, epoch in rows:
                previous = ExecutionState(state)
                target = (
                    ExecutionState.OUTCOME_UNKNOWN
                    if previous is ExecutionState.INVOKING
                    else ExecutionState.RELEASED
                )
                check_transition(previous, target)
                conn.execute(_UPDATE_STATE, (target, new_worker, new_epoch, agent, execution_id))
                recovered.append(
                    RecoveredExecution(
                        AgentId(agent), ExecutionId(execution_id), binding, call_id,
                        previous, target, WorkerId(worker), Epoch(epoch),
                    )
                )  # fmt: skip
            return recovered

        return await self._write(op)

    # ------------------------------------------------------------ audit chains

    async def open_chain(
        self,
        session_id: EvidenceSessionId,
        genesis: AuditEntry,
        *,
        worker: WorkerId,
        epoch: Epoch,
        then: Sequence[AuditEntry] = (),
        closed_with_claim: Mapping[str, Any] | None = None,
    ) -> ChainInfo:
        _check_link(genesis, session_id, 0, GENESIS_PREV)
        entry_json = _entry_json(genesis)
        following = [(entry, _entry_json(entry)) for entry in then]
        claim_json = None if closed_with_claim is None else _dumps(closed_with_claim)

        def op(conn: sqlite3.Connection) -> ChainInfo:
            generation = _fence(conn, worker, epoch)
            if conn.execute("SELECT 1 FROM chains WHERE session_id = ?", (session_id,)).fetchone():
                raise Conflict("audit chain already exists", session_id=session_id)
            conn.execute(
                "INSERT INTO chains (session_id, agent, root, head_seq, head_hash, generation, closed)"
                " VALUES (?, ?, ?, 0, ?, ?, 0)",
                (session_id, genesis.agent, genesis.hash, genesis.hash, generation),
            )
            _insert_entry(conn, genesis, entry_json, worker, epoch)
            head = genesis
            for entry, text in following:
                _check_link(entry, session_id, head.seq + 1, head.hash or "")
                _insert_entry(conn, entry, text, worker, epoch)
                head = entry
            if following:
                conn.execute(
                    "UPDATE chains SET head_seq = ?, head_hash = ? WHERE session_id = ?",
                    (head.seq, head.hash, session_id),
                )
            if claim_json is not None:
                if head.event != "session_close":
                    raise ValueError("a chain written closed ends with its close entry")
                conn.execute("UPDATE chains SET closed = 1 WHERE session_id = ?", (session_id,))
                conn.execute("INSERT INTO claims (session_id, claim) VALUES (?, ?)", (session_id, claim_json))
            return _select_chain(conn, session_id)  # type: ignore[return-value]

        return await self._write(op)

    async def append_entry(
        self, session_id: EvidenceSessionId, build: AppendBuilder, *, worker: WorkerId, epoch: Epoch
    ) -> AuditEntry:
        def op(conn: sqlite3.Connection) -> AuditEntry:
            _fence(conn, worker, epoch)
            return _append(conn, session_id, build, worker, epoch)

        return await self._write(op)

    async def append_entries(
        self,
        session_id: EvidenceSessionId,
        builds: Sequence[AppendBuilder],
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> list[AuditEntry]:
        def op(conn: sqlite3.Connection) -> list[AuditEntry]:
            _fence(conn, worker, epoch)
            return [_append(conn, session_id, build, worker, epoch) for build in builds]

        return await self._write(op)

    async def read_chain(
        self, session_id: EvidenceSessionId, *, start_seq: int = 0, limit: int | None = None
    ) -> list[AuditEntry]:
        def op(conn: sqlite3.Connection) -> list[AuditEntry]:
            rows = conn.execute(
                "SELECT entry FROM entries WHERE session_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (session_id, start_seq, -1 if limit is None else limit),
            ).fetchall()
            return [AuditEntry.from_json(json.loads(row[0])) for row in rows]

        return await self._read(op)

    async def get_chain(self, session_id: EvidenceSessionId) -> ChainInfo | None:
        return await self._read(lambda conn: _select_chain(conn, session_id))

    async def list_open_chains(self, *, generation: str | None = None) -> list[ChainInfo]:
        def op(conn: sqlite3.Connection) -> list[ChainInfo]:
            rows = conn.execute(
                _SELECT_CHAIN + " WHERE closed = 0 AND (? IS NULL OR generation = ?) ORDER BY session_id",
                (generation, generation),
            ).fetchall()
            return [_chain_from_row(row) for row in rows]

        return await self._read(op)

    async def close_chain(
        self,
        session_id: EvidenceSessionId,
        *,
        worker: WorkerId,
        epoch: Epoch,
        final: AppendBuilder | None = None,
        claim_for: Callable[[AuditEntry], Mapping[str, Any]] | None = None,
    ) -> ChainInfo:
        def op(conn: sqlite3.Connection) -> ChainInfo:
            _fence(conn, worker, epoch)
            closing = _append(conn, session_id, final, worker, epoch) if final is not None else None
            chain = _select_chain(conn, session_id)
            if chain is None:
                raise Conflict("unknown audit chain", session_id=session_id)
            if chain.closed:
                raise Conflict("audit chain is already closed", session_id=session_id)
            conn.execute("UPDATE chains SET closed = 1 WHERE session_id = ?", (session_id,))
            if claim_for is not None and closing is not None:
                claim_json = _dumps(claim_for(closing))
                conn.execute("INSERT INTO claims (session_id, claim) VALUES (?, ?)", (session_id, claim_json))
            return _select_chain(conn, session_id)  # type: ignore[return-value]

        return await self._write(op)

    async def store_claim(
        self,
        session_id: EvidenceSessionId,
        claim: Mapping[str, Any],
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> None:
        claim_json = _dumps(claim)

        def op(conn: sqlite3.Connection) -> None:
            _fence(conn, worker, epoch)
            chain = _select_chain(conn, session_id)
            if chain is None or not chain.closed:
                raise Conflict("a claim needs a closed audit chain", session_id=session_id)
            if conn.execute("SELECT 1 FROM claims WHERE session_id = ?", (session_id,)).fetchone():
                raise Conflict("the chain already has a claim", session_id=session_id)
            conn.execute("INSERT INTO claims (session_id, claim) VALUES (?, ?)", (session_id, claim_json))

        await self._write(op)

    async def get_claim(self, session_id: EvidenceSessionId) -> dict[str, Any] | None:
        def op(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute("SELECT claim FROM claims WHERE session_id = ?", (session_id,)).fetchone()
            return None if row is None else dict(json.loads(row[0]))

        return await self._read(op)

    # ------------------------------------------------------------ agent sessions and credentials
    # Unfenced admin writes: see store/base.py, "Agent sessions and credentials".

    async def create_agent_session(
        self,
        *,
        human: str,
        agent: AgentId,
        team: str | None,
        scopes: frozenset[str],
        now: datetime,
        expires_at: datetime,
    ) -> AgentSessionRecord:
        if not human or not agent or team == "":
            raise ValueError("human and agent must be non-empty, team non-empty or None")
        created_us, expires_us = _to_us(now), _to_us(expires_at)
        if expires_us <= created_us:
            raise ValueError("an agent session must expire after it is created")
        agent_session_id = "as_" + secrets.token_hex(16)
        scopes_json = _dumps(sorted(scopes))

        def op(conn: sqlite3.Connection) -> AgentSessionRecord:
            conn.execute(
                "INSERT INTO agent_sessions (agent_session_id, human, agent, team, scopes, created_at,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (agent_session_id, human, agent, team, scopes_json, created_us, expires_us),
            )
            return _select_agent_session(conn, agent_session_id)  # type: ignore[return-value]

        return await self._write(op)

    async def add_credential(
        self, agent_session_id: str, kind: CredentialKind, digest: str, *, now: datetime
    ) -> CredentialRecord:
        kind = CredentialKind(kind)
        _check_digest(digest)
        now_us = _to_us(now)

        def op(conn: sqlite3.Connection) -> CredentialRecord:
            _usable_agent_session(conn, agent_session_id, now)
            return _insert_credential(conn, agent_session_id, kind, digest, now_us, None)

        return await self._write(op)

    async def find_credential(
        self, kind: CredentialKind, digest: str
    ) -> tuple[CredentialRecord, AgentSessionRecord] | None:
        kind = CredentialKind(kind)

        def op(conn: sqlite3.Connection) -> tuple[CredentialRecord, AgentSessionRecord] | None:
            row = conn.execute(
                _SELECT_CREDENTIAL + " WHERE kind = ? AND digest = ?", (kind, digest)
            ).fetchone()
            if row is None:
                return None
            credential = _credential_from_row(row)
            # One read transaction for both rows: the pair is consistent.
            agent_session = _select_agent_session(conn, credential.agent_session_id)
            assert agent_session is not None  # the foreign key guarantees it
            return credential, agent_session

        return await self._read(lambda conn: _in_read_transaction(conn, op))

    async def get_agent_session(self, agent_session_id: str) -> AgentSessionRecord | None:
        return await self._read(lambda conn: _select_agent_session(conn, agent_session_id))

    async def list_agent_sessions(self, *, agent: AgentId | None = None) -> list[AgentSessionRecord]:
        def op(conn: sqlite3.Connection) -> list[AgentSessionRecord]:
            rows = conn.execute(
                _SELECT_AGENT_SESSION
                + " WHERE (? IS NULL OR agent = ?) ORDER BY created_at, agent_session_id",
                (agent, agent),
            ).fetchall()
            return [_agent_session_from_row(row) for row in rows]

        return await self._read(op)

    async def list_credentials(self, agent_session_id: str) -> list[CredentialRecord]:
        def op(conn: sqlite3.Connection) -> list[CredentialRecord]:
            rows = conn.execute(
                _SELECT_CREDENTIAL + " WHERE agent_session_id = ? ORDER BY created_at, rowid",
                (agent_session_id,),
            ).fetchall()
            return [_credential_from_row(row) for row in rows]

        return await self._read(op)

    async def revoke_agent_session(
        self, agent_session_id: str, *, by: str, reason: str, now: datetime
    ) -> AgentSessionRecord:
        if not by:
            raise ValueError("a revocation names who revoked")
        now_us = _to_us(now)

        def op(conn: sqlite3.Connection) -> AgentSessionRecord:
            # The first revocation wins; a later one records nothing over it.
            conn.execute(
                "UPDATE agent_sessions SET revoked_at = ?, revoked_by = ?, revoke_reason = ?"
                " WHERE agent_session_id = ? AND revoked_at IS NULL",
                (now_us, by, reason, agent_session_id),
            )
            record = _select_agent_session(conn, agent_session_id)
            if record is None:
                raise Conflict("unknown agent session", agent_session_id=agent_session_id)
            return record

        return await self._write(op)

    async def renew_credential(
        self, old_credential_id: str, new_digest: str, *, now: datetime
    ) -> CredentialRecord:
        _check_digest(new_digest)
        now_us = _to_us(now)

        def op(conn: sqlite3.Connection) -> CredentialRecord:
            row = conn.execute(
                _SELECT_CREDENTIAL + " WHERE credential_id = ?", (old_credential_id,)
            ).fetchone()
            if row is None:
                raise Conflict("unknown credential", credential_id=old_credential_id)
            old = _credential_from_row(row)
            if old.superseded_at is not None:
                raise Conflict("the credential was already superseded", credential_id=old_credential_id)
            _usable_agent_session(conn, old.agent_session_id, now)
            conn.execute(
                "UPDATE credentials SET superseded_at = ? WHERE credential_id = ?",
                (now_us, old_credential_id),
            )
            return _insert_credential(
                conn, old.agent_session_id, old.kind, new_digest, now_us, old_credential_id
            )

        return await self._write(op)


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

    __slots__ = ("done", "error", "op", "taken", "value")

    def __init__(self, op: Callable[[sqlite3.Connection], T]) -> None:
        self.op = op
        self.taken = False
        self.done = False
        self.value: T | _Unset = _UNSET
        self.error: BaseException | None = None

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        assert not isinstance(self.value, _Unset)
        return self.value


def _fail_all(jobs: list[_Job[Any]], error: StoreError) -> None:
    for job in jobs:
        job.value = _UNSET
        job.error = error
        job.done = True


def _translate(exc: Exception) -> BaseException:
    if isinstance(exc, sqlite3.IntegrityError):
        return Conflict("the write violates a store constraint", detail=type(exc).__name__)
    if isinstance(exc, sqlite3.Error):
        return NotDurable("the write could not be made durable", detail=type(exc).__name__)
    return exc


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


def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _entry_json(entry: AuditEntry) -> str:
    # Every field, as ``AuditEntry.to_json`` has them; orjson, because this runs per append.
    # The entry was canonicalized when sealed, so it holds no value json would refuse.
    return orjson.dumps(entry.to_json()).decode()


def _to_us(moment: datetime) -> int:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("store times must be timezone-aware")
    return (moment - _EPOCH_ZERO) // _MICROSECOND


def _from_us(value: int) -> datetime:
    return _EPOCH_ZERO + value * _MICROSECOND


def _fence(conn: sqlite3.Connection, worker: WorkerId, epoch: Epoch) -> str:
    """The writer's generation, if ``worker`` holds it at exactly ``epoch``; else :class:`StaleEpoch`."""
    row = conn.execute(
        "SELECT w.generation, g.holder, g.epoch FROM workers AS w"
        " LEFT JOIN generations AS g ON g.generation = w.generation WHERE w.worker_id = ?",
        (worker,),
    ).fetchone()
    if row is None or row[0] is None or row[1] != worker or row[2] != epoch:
        raise StaleEpoch(epoch=epoch, current_epoch=None if row is None else row[2])
    return str(row[0])


_SELECT_EXECUTION = (
    "SELECT agent, execution_id, binding, state, call_id, generation, worker, epoch FROM executions"
    " WHERE agent = ? AND execution_id = ?"
)
_UPDATE_STATE = "UPDATE executions SET state = ?, worker = ?, epoch = ? WHERE agent = ? AND execution_id = ?"


def _select_execution(
    conn: sqlite3.Connection, agent: AgentId, execution_id: ExecutionId
) -> ExecutionRecord | None:
    row = conn.execute(_SELECT_EXECUTION, (agent, execution_id)).fetchone()
    if row is None:
        return None
    return ExecutionRecord(
        AgentId(row[0]), ExecutionId(row[1]), row[2], ExecutionState(row[3]),
        None if row[4] is None else CallId(row[4]), row[5], WorkerId(row[6]), Epoch(row[7]),
    )  # fmt: skip


def _transition(
    conn: sqlite3.Connection,
    agent: AgentId,
    execution_id: ExecutionId,
    target: ExecutionState,
    worker: WorkerId,
    epoch: Epoch,
) -> ExecutionRecord:
    generation = _fence(conn, worker, epoch)
    row = _select_execution(conn, agent, execution_id)
    if row is None:
        raise Conflict("no such execution", execution_id=execution_id)
    if row.generation != generation:
        raise Conflict("the execution belongs to another generation", execution_id=execution_id)
    check_transition(row.state, target)
    conn.execute(_UPDATE_STATE, (target, worker, epoch, agent, execution_id))
    return _select_execution(conn, agent, execution_id)  # type: ignore[return-value]


# The first withdrawal (or failure) wins: a later one matches no row.
_WITHDRAW_LIVENESS = (
    "UPDATE workers SET withdrawn_at = ?, withdraw_reason = ? WHERE worker_id = ? AND withdrawn_at IS NULL"
)
_MARK_FAILED = (
    "UPDATE workers SET failed_at = ?, failure_reason = ? WHERE worker_id = ? AND failed_at IS NULL"
)
_SELECT_WORKER = (
    "SELECT worker_id, role, provenance, registered_at, heartbeat_at, generation, claimed_epoch,"
    " withdrawn_at, withdraw_reason, failed_at, failure_reason FROM workers"
)


def _worker_from_row(row: tuple[Any, ...]) -> WorkerRecord:
    return WorkerRecord(
        WorkerId(row[0]), row[1], json.loads(row[2]), _from_us(row[3]), _from_us(row[4]), row[5],
        None if row[6] is None else Epoch(row[6]),
        None if row[7] is None else _from_us(row[7]), row[8],
        None if row[9] is None else _from_us(row[9]), row[10],
    )  # fmt: skip


def _select_worker(conn: sqlite3.Connection, worker_id: WorkerId) -> WorkerRecord | None:
    row = conn.execute(_SELECT_WORKER + " WHERE worker_id = ?", (worker_id,)).fetchone()
    return None if row is None else _worker_from_row(row)


_SELECT_CHAIN = "SELECT session_id, agent, root, head_seq, head_hash, generation, closed FROM chains"


def _chain_from_row(row: tuple[Any, ...]) -> ChainInfo:
    return ChainInfo(
        EvidenceSessionId(row[0]), None if row[1] is None else AgentId(row[1]),
        row[2], row[3], row[4], row[5], bool(row[6]),
    )  # fmt: skip


def _select_chain(conn: sqlite3.Connection, session_id: EvidenceSessionId) -> ChainInfo | None:
    row = conn.execute(_SELECT_CHAIN + " WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else _chain_from_row(row)


def _append(
    conn: sqlite3.Connection,
    session_id: EvidenceSessionId,
    build: AppendBuilder,
    worker: WorkerId,
    epoch: Epoch,
) -> AuditEntry:
    head = conn.execute(
        "SELECT head_seq, head_hash, closed FROM chains WHERE session_id = ?", (session_id,)
    ).fetchone()
    if head is None:
        raise Conflict("unknown audit chain", session_id=session_id)
    if head[2]:
        raise Conflict("audit chain is closed", session_id=session_id)
    entry = build(head[0] + 1, head[1])
    _check_link(entry, session_id, head[0] + 1, head[1])
    _insert_entry(conn, entry, _entry_json(entry), worker, epoch)
    conn.execute(
        "UPDATE chains SET head_seq = ?, head_hash = ? WHERE session_id = ?",
        (entry.seq, entry.hash, session_id),
    )
    return entry


def _check_link(entry: AuditEntry, session_id: EvidenceSessionId, seq: int, prev: str) -> None:
    if entry.hash is None:
        raise ValueError("audit entry is not sealed")
    if entry.session_id != session_id or entry.seq != seq or entry.prev != prev:
        raise ValueError("audit entry is not the next link of its chain")


def _insert_entry(
    conn: sqlite3.Connection, entry: AuditEntry, entry_json: str, worker: WorkerId, epoch: Epoch
) -> None:
    conn.execute(
        "INSERT INTO entries (session_id, seq, prev, hash, entry, worker, epoch)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (entry.session_id, entry.seq, entry.prev, entry.hash, entry_json, worker, epoch),
    )


_SELECT_AGENT_SESSION = (
    "SELECT agent_session_id, human, agent, team, scopes, created_at, expires_at, revoked_at, revoked_by,"
    " revoke_reason FROM agent_sessions"
)
_SELECT_CREDENTIAL = (
    "SELECT credential_id, agent_session_id, kind, digest, created_at, superseded_at, renewed_from"
    " FROM credentials"
)


def _agent_session_from_row(row: tuple[Any, ...]) -> AgentSessionRecord:
    return AgentSessionRecord(
        row[0], row[1], AgentId(row[2]), row[3], frozenset(json.loads(row[4])),
        _from_us(row[5]), _from_us(row[6]), None if row[7] is None else _from_us(row[7]), row[8], row[9],
    )  # fmt: skip


def _select_agent_session(conn: sqlite3.Connection, agent_session_id: str) -> AgentSessionRecord | None:
    row = conn.execute(_SELECT_AGENT_SESSION + " WHERE agent_session_id = ?", (agent_session_id,)).fetchone()
    return None if row is None else _agent_session_from_row(row)


def _usable_agent_session(conn: sqlite3.Connection, agent_session_id: str, now: datetime) -> None:
    """Raise unless the agent session exists, is not revoked and has not expired at ``now``."""
    record = _select_agent_session(conn, agent_session_id)
    if record is None:
        raise Conflict("unknown agent session", agent_session_id=agent_session_id)
    if record.revoked_at is not None:
        raise AgentSessionRevoked()
    if now >= record.expires_at:
        raise AgentSessionExpired()


def _credential_from_row(row: tuple[Any, ...]) -> CredentialRecord:
    return CredentialRecord(
        row[0], row[1], CredentialKind(row[2]), row[3], _from_us(row[4]),
        None if row[5] is None else _from_us(row[5]), row[6],
    )  # fmt: skip


def _insert_credential(
    conn: sqlite3.Connection,
    agent_session_id: str,
    kind: CredentialKind,
    digest: str,
    now_us: int,
    renewed_from: str | None,
) -> CredentialRecord:
    if conn.execute("SELECT 1 FROM credentials WHERE kind = ? AND digest = ?", (kind, digest)).fetchone():
        raise Conflict("this credential was bound before", kind=kind.value)
    credential_id = "cred_" + secrets.token_hex(12)
    conn.execute(
        "INSERT INTO credentials (credential_id, agent_session_id, kind, digest, created_at, superseded_at,"
        " renewed_from) VALUES (?, ?, ?, ?, ?, NULL, ?)",
        (credential_id, agent_session_id, kind, digest, now_us, renewed_from),
    )
    row = conn.execute(_SELECT_CREDENTIAL + " WHERE credential_id = ?", (credential_id,)).fetchone()
    return _credential_from_row(row)


def _check_digest(digest: str) -> None:
    if not isinstance(digest, str) or not _DIGEST_RULE.fullmatch(digest):
        raise ValueError("a credential digest is 64 lowercase hex digits (SHA-256)")


def _in_read_transaction(conn: sqlite3.Connection, op: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``op`` in one read transaction (one snapshot of the WAL), so related rows agree."""
    conn.execute("BEGIN")
    try:
        return op(conn)
    finally:
        conn.execute("COMMIT")
