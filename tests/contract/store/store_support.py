"""Helpers shared by the store contract tests (imported by basename; pytest puts this folder on sys.path)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bastion.audit.entry import GENESIS_PREV, AuditEntry, compute_hash
from bastion.ids import AgentId, Epoch, ExecutionId, WorkerId
from bastion.store.base import AppendBuilder, Store

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
LEASE_S = 30.0
AGENT = AgentId("agent-1")
EID = ExecutionId("exec-0001")


@dataclass(frozen=True)
class Writer:
    """A registered worker holding its generation: what every fenced write names."""

    worker: WorkerId
    epoch: Epoch
    generation: str


async def new_writer(store: Store, name: str, generation: str, *, now: datetime = NOW) -> Writer:
    worker = WorkerId(name)
    await store.register_worker(worker, "gateway", {"launched_by": "pytest", "name": name}, now=now)
    epoch = await store.claim_generation(generation, worker, now=now, lease_s=LEASE_S)
    return Writer(worker, epoch, generation)


def make_entry(
    session_id: str, seq: int, prev: str, *, event: str = "admitted", **fields: object
) -> AuditEntry:
    """A sealed entry; ``fields`` override the nulls."""
    values: dict[str, object] = {name: None for name in AuditEntry.__dataclass_fields__}
    values.update(
        seq=seq,
        ts="2026-05-01T12:00:00.000000Z",
        session_id=session_id,
        agent="agent-1",
        event=event,
        prev=prev,
    )
    values.update(fields)
    return AuditEntry(**values).seal()  # type: ignore[arg-type]


def genesis(session_id: str, **fields: object) -> AuditEntry:
    return make_entry(session_id, 0, GENESIS_PREV, event="session_open", **fields)


def builder(session_id: str, **fields: object) -> AppendBuilder:
    """An append builder that seals an ``admitted`` entry at whatever link it is given."""

    def build(seq: int, prev: str) -> AuditEntry:
        return make_entry(session_id, seq, prev, **fields)

    return build


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def assert_linked(entries: list[AuditEntry]) -> None:
    """seq 0..n-1 contiguous, every prev the previous hash, every hash recomputes."""
    assert [e.seq for e in entries] == list(range(len(entries)))
    prev = GENESIS_PREV
    for entry in entries:
        assert entry.prev == prev
        assert entry.hash == compute_hash(entry.prev, entry.body())
        prev = entry.hash
