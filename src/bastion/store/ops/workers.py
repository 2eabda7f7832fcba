"""Operations on workers, generations and attachments: registration, claims, fencing, liveness.

Every fenced write calls :func:`fence` first, in its own transaction: the
engine locks the writer's generation row (PostgreSQL ``FOR KEY SHARE``), so a
takeover (which locks it ``FOR UPDATE``) waits for writes already fenced and
every later write sees the new holder.
"""

from __future__ import annotations

from typing import Any

from bastion.errors import Conflict, StaleEpoch
from bastion.ids import Epoch, WorkerId
from bastion.store.base import AttachmentRecord, GenerationBacklog, WorkerRecord
from bastion.store.rows import (
    SELECT_ATTACHMENT,
    SELECT_WORKER,
    attachment_from_row,
    from_us,
    worker_from_row,
)
from bastion.store.statements import Op, count, execute, one, rows

# The first withdrawal (or failure) wins: a later one matches no row.
WITHDRAW_LIVENESS = (
    "UPDATE workers SET withdrawn_at = ?, withdraw_reason = ? WHERE worker_id = ? AND withdrawn_at IS NULL"
)
MARK_FAILED = "UPDATE workers SET failed_at = ?, failure_reason = ? WHERE worker_id = ? AND failed_at IS NULL"


def fence(worker: WorkerId, epoch: Epoch) -> Op[str]:
    """The writer's generation, if ``worker`` holds it at exactly ``epoch``; else :class:`StaleEpoch`."""
    row = yield from one(
        "SELECT w.generation, g.holder, g.epoch FROM workers AS w"
        " JOIN generations AS g ON g.generation = w.generation WHERE w.worker_id = ?",
        worker,
        lock="FOR KEY SHARE OF g",
    )
    if row is None or row[1] != worker or row[2] != epoch:
        raise StaleEpoch(epoch=epoch, current_epoch=None if row is None else row[2])
    return str(row[0])


def select_worker(worker_id: WorkerId) -> Op[WorkerRecord | None]:
    row = yield from one(SELECT_WORKER + " WHERE worker_id = ?", worker_id)
    return None if row is None else worker_from_row(row)


def worker_exists(worker_id: WorkerId) -> Op[bool]:
    return (yield from one("SELECT 1 FROM workers WHERE worker_id = ?", worker_id)) is not None


def register_worker(worker_id: WorkerId, role: str, provenance_json: str, now_us: int) -> Op[WorkerRecord]:
    if (yield from worker_exists(worker_id)):
        raise Conflict("worker identity already registered", worker=worker_id)
    yield from execute(
        "INSERT INTO workers (worker_id, role, provenance, registered_at, heartbeat_at, generation)"
        " VALUES (?, ?, ?, ?, ?, NULL)",
        worker_id, role, provenance_json, now_us, now_us,
    )  # fmt: skip
    return (yield from select_worker(worker_id))  # type: ignore[return-value]


def claim_generation(generation: str, worker_id: WorkerId, now_us: int, lease_us: int) -> Op[Epoch]:
    claimant = yield from one(
        "SELECT generation, withdrawn_at IS NOT NULL OR failed_at IS NOT NULL FROM workers"
        " WHERE worker_id = ?",
        worker_id,
        lock="FOR UPDATE",
    )
    if claimant is None:
        raise Conflict("unknown worker", worker=worker_id)
    if claimant[0] is not None and claimant[0] != generation:
        raise Conflict("worker already holds another generation", worker=worker_id)
    if claimant[1]:
        raise Conflict("worker liveness was withdrawn or it failed", worker=worker_id)
    held = yield from one(
        "SELECT g.epoch, w.heartbeat_at, w.withdrawn_at IS NOT NULL OR w.failed_at IS NOT NULL"
        " FROM generations AS g JOIN workers AS w ON w.worker_id = g.holder WHERE g.generation = ?",
        generation,
        lock="FOR UPDATE OF g, w",
    )
    if held is None:
        epoch = 1
        yield from execute(
            "INSERT INTO generations (generation, holder, epoch, claimed_at) VALUES (?, ?, 1, ?)",
            generation, worker_id, now_us,
        )  # fmt: skip
    else:
        if not held[2] and now_us - held[1] < lease_us:
            raise Conflict("generation is held by a live worker", generation=generation)
        epoch = held[0] + 1
        yield from execute(
            "UPDATE generations SET holder = ?, epoch = ?, claimed_at = ? WHERE generation = ?",
            worker_id, epoch, now_us, generation,
        )  # fmt: skip
    yield from execute(
        "UPDATE workers SET generation = ?, claimed_epoch = ?,"
        " heartbeat_at = CASE WHEN heartbeat_at > ? THEN heartbeat_at ELSE ? END WHERE worker_id = ?",
        generation, epoch, now_us, now_us, worker_id,
    )  # fmt: skip
    return Epoch(epoch)


def heartbeat(worker_id: WorkerId, now_us: int) -> Op[None]:
    row = yield from one(
        "SELECT w.generation, g.holder, w.withdrawn_at IS NOT NULL OR w.failed_at IS NOT NULL"
        " FROM workers AS w LEFT JOIN generations AS g ON g.generation = w.generation"
        " WHERE w.worker_id = ?",
        worker_id,
        lock="FOR UPDATE OF w",
    )
    if row is None:
        raise Conflict("unknown worker", worker=worker_id)
    if row[0] is not None and row[1] != worker_id:
        raise StaleEpoch("worker was superseded in its generation", worker=worker_id)
    if row[2]:
        raise StaleEpoch("worker liveness was withdrawn or it failed", worker=worker_id)
    yield from execute(
        "UPDATE workers SET heartbeat_at = CASE WHEN heartbeat_at > ? THEN heartbeat_at ELSE ? END"
        " WHERE worker_id = ?",
        now_us,
        now_us,
        worker_id,
    )


def end_liveness(worker_id: WorkerId, update: str, reason: str, now_us: int) -> Op[WorkerRecord]:
    """Run ``update`` (:data:`WITHDRAW_LIVENESS` or :data:`MARK_FAILED`); the first one wins."""
    yield from execute(update, now_us, reason, worker_id)
    record = yield from select_worker(worker_id)
    if record is None:
        raise Conflict("unknown worker", worker=worker_id)
    return record


def list_workers() -> Op[list[WorkerRecord]]:
    found = yield from rows(SELECT_WORKER + " ORDER BY registered_at, worker_id")
    return [worker_from_row(row) for row in found]


def generation_backlog(generation: str) -> Op[GenerationBacklog]:
    # An execution whose task is live is its task's to settle, at any replica: nothing to take over.
    executions = yield from one(
        "SELECT COUNT(*) FROM executions WHERE generation = ? AND state IN ('reserved', 'invoking')"
        " AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.agent = executions.agent"
        " AND tasks.execution_id = executions.execution_id"
        " AND tasks.status IN ('working', 'input_required'))",
        generation,
    )
    chains = yield from one("SELECT COUNT(*) FROM chains WHERE generation = ? AND closed = 0", generation)
    assert executions is not None and chains is not None
    return GenerationBacklog(generation, int(executions[0]), int(chains[0]))


def record_attachment(
    worker_id: WorkerId, ref: str, namespace: str, now_us: int, writer: WorkerId, epoch: Epoch
) -> Op[AttachmentRecord]:
    yield from fence(writer, epoch)
    if not (yield from worker_exists(worker_id)):
        raise Conflict("unknown worker", worker=worker_id)
    yield from execute(
        "INSERT INTO attachments (worker_id, transport_session_ref, namespace, attached_at, writer, epoch)"
        " VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (worker_id, transport_session_ref, namespace) DO UPDATE SET"
        " attached_at = excluded.attached_at, writer = excluded.writer, epoch = excluded.epoch",
        worker_id, ref, namespace, now_us, writer, epoch,
    )  # fmt: skip
    return AttachmentRecord(worker_id, ref, namespace, from_us(now_us), writer, epoch)


def clear_attachment(
    worker_id: WorkerId, ref: str, namespace: str, writer: WorkerId, epoch: Epoch
) -> Op[bool]:
    yield from fence(writer, epoch)
    deleted = yield from count(
        "DELETE FROM attachments WHERE worker_id = ? AND transport_session_ref = ? AND namespace = ?",
        worker_id, ref, namespace,
    )  # fmt: skip
    return deleted > 0


def list_attachments(worker_id: WorkerId | None, ref: str | None) -> Op[list[AttachmentRecord]]:
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("worker_id", worker_id), ("transport_session_ref", ref)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    condition = " WHERE " + " AND ".join(where) if where else ""
    found = yield from rows(
        SELECT_ATTACHMENT + condition + " ORDER BY attached_at, worker_id, transport_session_ref, namespace",
        *params,
    )
    return [attachment_from_row(row) for row in found]
