"""Operations on audit chains: open, append, close, claims.

An append reads the chain's head ``FOR UPDATE`` (PostgreSQL) in the same
transaction as it writes the next link, so concurrent appends to one chain,
from any replica, never fork or leave a gap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bastion.audit.entry import GENESIS_PREV, AuditEntry
from bastion.errors import Conflict
from bastion.ids import Epoch, EvidenceSessionId, WorkerId
from bastion.store.base import AppendBuilder, ChainInfo, ExecutionStep
from bastion.store.ops.executions import apply_step
from bastion.store.ops.workers import fence
from bastion.store.rows import SELECT_CHAIN, chain_from_row, check_link, dumps, entry_json
from bastion.store.statements import Op, execute, one

_INSERT_CLAIM = "INSERT INTO claims (session_id, claim) VALUES (?, ?)"


def select_chain(session_id: EvidenceSessionId, *, lock: bool = False) -> Op[ChainInfo | None]:
    row = yield from one(
        SELECT_CHAIN + " WHERE session_id = ?", session_id, lock="FOR UPDATE" if lock else ""
    )
    return None if row is None else chain_from_row(row)


_INSERT_ENTRIES = (
    "INSERT INTO entries (session_id, seq, prev, hash, entry, worker, epoch, execution_id, agent) VALUES "
)
_ENTRY_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?)"
#: Rows per INSERT: one statement for the links of a call, well under either engine's parameter limit.
_ROWS_PER_INSERT = 64


def _insert_entries(entries: Sequence[tuple[AuditEntry, str]], worker: WorkerId, epoch: Epoch) -> Op[None]:
    """Insert linked entries, as few statements as the engines allow (one for a call's links)."""
    for start in range(0, len(entries), _ROWS_PER_INSERT):
        chunk = entries[start : start + _ROWS_PER_INSERT]
        params: list[Any] = []
        for entry, text in chunk:
            params += (
                entry.session_id, entry.seq, entry.prev, entry.hash, text, worker, epoch, entry.execution_id,
                entry.agent,
            )  # fmt: skip
        yield from execute(_INSERT_ENTRIES + ", ".join([_ENTRY_ROW] * len(chunk)), *params)


def append(
    session_id: EvidenceSessionId, build: AppendBuilder, worker: WorkerId, epoch: Epoch
) -> Op[AuditEntry]:
    """Append one link under the chain's row lock (the caller fenced the writer)."""
    return (yield from append_links(session_id, (build,), worker, epoch))[0]


def append_links(
    session_id: EvidenceSessionId, builds: Sequence[AppendBuilder], worker: WorkerId, epoch: Epoch
) -> Op[list[AuditEntry]]:
    """Append links in order under the chain's row lock, read once; the head is written once."""
    if not builds:
        return []
    head = yield from one(
        "SELECT head_seq, head_hash, closed FROM chains WHERE session_id = ?", session_id, lock="FOR UPDATE"
    )
    if head is None:
        raise Conflict("unknown audit chain", session_id=session_id)
    if head[2]:
        raise Conflict("audit chain is closed", session_id=session_id)
    seq, prev = head[0], head[1]
    appended = []
    for build in builds:
        entry = build(seq + 1, prev)
        check_link(entry, session_id, seq + 1, prev)
        assert entry.hash is not None  # check_link refuses an unsealed entry
        seq, prev = entry.seq, entry.hash
        appended.append(entry)
    yield from _insert_entries([(entry, entry_json(entry)) for entry in appended], worker, epoch)
    yield from execute(
        "UPDATE chains SET head_seq = ?, head_hash = ? WHERE session_id = ?", seq, prev, session_id
    )
    return appended


def append_entries(
    session_id: EvidenceSessionId,
    builds: Sequence[AppendBuilder],
    worker: WorkerId,
    epoch: Epoch,
    step: ExecutionStep | None = None,
) -> Op[list[AuditEntry]]:
    generation = yield from fence(worker, epoch)
    if step is not None:
        # The transition first: refused, it raises and nothing of this write remains.
        yield from apply_step(step, generation, worker, epoch)
    return (yield from append_links(session_id, builds, worker, epoch))


def open_chain(
    session_id: EvidenceSessionId,
    genesis: AuditEntry,
    worker: WorkerId,
    epoch: Epoch,
    then: Sequence[AuditEntry],
    closed_with_claim: Mapping[str, Any] | None,
    step: ExecutionStep | None = None,
) -> Op[ChainInfo]:
    check_link(genesis, session_id, 0, GENESIS_PREV)
    following = [(entry, entry_json(entry)) for entry in then]
    claim_json = None if closed_with_claim is None else dumps(closed_with_claim)
    generation = yield from fence(worker, epoch)
    if step is not None:
        yield from apply_step(step, generation, worker, epoch)
    if (yield from one("SELECT 1 FROM chains WHERE session_id = ?", session_id)) is not None:
        raise Conflict("audit chain already exists", session_id=session_id)
    yield from execute(
        "INSERT INTO chains (session_id, agent, root, head_seq, head_hash, generation, closed)"
        " VALUES (?, ?, ?, 0, ?, ?, 0)",
        session_id, genesis.agent, genesis.hash, genesis.hash, generation,
    )  # fmt: skip
    head = genesis
    for entry, _ in following:
        check_link(entry, session_id, head.seq + 1, head.hash or "")
        head = entry
    yield from _insert_entries([(genesis, entry_json(genesis)), *following], worker, epoch)
    if following:
        yield from execute(
            "UPDATE chains SET head_seq = ?, head_hash = ? WHERE session_id = ?",
            head.seq,
            head.hash,
            session_id,
        )
    if claim_json is not None:
        if head.event != "session_close":
            raise ValueError("a chain written closed ends with its close entry")
        yield from execute("UPDATE chains SET closed = 1 WHERE session_id = ?", session_id)
        yield from execute(_INSERT_CLAIM, session_id, claim_json)
    return (yield from select_chain(session_id))  # type: ignore[return-value]


def close_chain(
    session_id: EvidenceSessionId,
    worker: WorkerId,
    epoch: Epoch,
    final: AppendBuilder | None,
    claim_for: Callable[[AuditEntry], Mapping[str, Any]] | None,
) -> Op[ChainInfo]:
    yield from fence(worker, epoch)
    closing = (yield from append(session_id, final, worker, epoch)) if final is not None else None
    chain = yield from select_chain(session_id, lock=True)
    if chain is None:
        raise Conflict("unknown audit chain", session_id=session_id)
    if chain.closed:
        raise Conflict("audit chain is already closed", session_id=session_id)
    yield from execute("UPDATE chains SET closed = 1 WHERE session_id = ?", session_id)
    if claim_for is not None and closing is not None:
        yield from execute(_INSERT_CLAIM, session_id, dumps(claim_for(closing)))
    return (yield from select_chain(session_id))  # type: ignore[return-value]


def store_claim(session_id: EvidenceSessionId, claim_json: str, worker: WorkerId, epoch: Epoch) -> Op[None]:
    yield from fence(worker, epoch)
    chain = yield from select_chain(session_id, lock=True)
    if chain is None or not chain.closed:
        raise Conflict("a claim needs a closed audit chain", session_id=session_id)
    if (yield from one("SELECT 1 FROM claims WHERE session_id = ?", session_id)) is not None:
        raise Conflict("the chain already has a claim", session_id=session_id)
    yield from execute(_INSERT_CLAIM, session_id, claim_json)
