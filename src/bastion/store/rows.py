"""Rows and records, shared by every engine: how a record is stored and read back, and what is refused.

Times are integer microseconds since the UNIX epoch (UTC) in every engine;
JSON columns hold UTF-8 JSON text; flags are ``0``/``1``. The ``SELECT_*``
column lists and the ``*_from_row`` mappers go together: change both or neither.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from bastion.admission.states import ExecutionState
from bastion.audit.entry import AuditEntry
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.base import (
    AgentSessionRecord,
    AttachmentRecord,
    ChainInfo,
    CredentialKind,
    CredentialRecord,
    ExecutionRecord,
    GenerationRecord,
    WorkerRecord,
)

_EPOCH_ZERO = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_HEX64 = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------- values


def to_us(moment: datetime) -> int:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("store times must be timezone-aware")
    return (moment - _EPOCH_ZERO) // _MICROSECOND


def from_us(value: int) -> datetime:
    return _EPOCH_ZERO + value * _MICROSECOND


def maybe_from_us(value: int | None) -> datetime | None:
    return None if value is None else from_us(value)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def entry_json(entry: AuditEntry) -> str:
    # Every field, as ``AuditEntry.to_json`` has them; orjson, because this runs per append.
    # The entry was canonicalized when sealed, so it holds no value json would refuse.
    return orjson.dumps(entry.to_json()).decode()


# ---------------------------------------------------------------- what is refused before any I/O


def check_binding(binding: str) -> None:
    if not isinstance(binding, str) or not _HEX64.fullmatch(binding):
        raise ValueError("binding must be the 64-digit lowercase SHA-256 hex of admission.binding")


def check_digest(digest: str) -> None:
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise ValueError("a credential digest is 64 lowercase hex digits (SHA-256)")


def check_link(entry: AuditEntry, session_id: EvidenceSessionId, seq: int, prev: str) -> None:
    if entry.hash is None:
        raise ValueError("audit entry is not sealed")
    if entry.session_id != session_id or entry.seq != seq or entry.prev != prev:
        raise ValueError("audit entry is not the next link of its chain")


# ---------------------------------------------------------------- rows to records

SELECT_EXECUTION = (
    "SELECT agent, execution_id, binding, state, call_id, generation, worker, epoch FROM executions"
    " WHERE agent = ? AND execution_id = ?"
)


def execution_from_row(row: tuple[Any, ...]) -> ExecutionRecord:
    return ExecutionRecord(
        AgentId(row[0]), ExecutionId(row[1]), row[2], ExecutionState(row[3]),
        None if row[4] is None else CallId(row[4]), row[5], WorkerId(row[6]), Epoch(row[7]),
    )  # fmt: skip


SELECT_WORKER = (
    "SELECT worker_id, role, provenance, registered_at, heartbeat_at, generation, claimed_epoch,"
    " withdrawn_at, withdraw_reason, failed_at, failure_reason FROM workers"
)


def worker_from_row(row: tuple[Any, ...]) -> WorkerRecord:
    return WorkerRecord(
        WorkerId(row[0]), row[1], json.loads(row[2]), from_us(row[3]), from_us(row[4]), row[5],
        None if row[6] is None else Epoch(row[6]),
        maybe_from_us(row[7]), row[8], maybe_from_us(row[9]), row[10],
    )  # fmt: skip


SELECT_GENERATION = "SELECT generation, holder, epoch, claimed_at FROM generations"


def generation_from_row(row: tuple[Any, ...]) -> GenerationRecord:
    return GenerationRecord(row[0], WorkerId(row[1]), Epoch(row[2]), from_us(row[3]))


SELECT_ATTACHMENT = (
    "SELECT worker_id, transport_session_ref, namespace, attached_at, writer, epoch FROM attachments"
)


def attachment_from_row(row: tuple[Any, ...]) -> AttachmentRecord:
    return AttachmentRecord(
        WorkerId(row[0]), row[1], row[2], from_us(row[3]), WorkerId(row[4]), Epoch(row[5])
    )


SELECT_CHAIN = "SELECT session_id, agent, root, head_seq, head_hash, generation, closed FROM chains"


def chain_from_row(row: tuple[Any, ...]) -> ChainInfo:
    return ChainInfo(
        EvidenceSessionId(row[0]), None if row[1] is None else AgentId(row[1]),
        row[2], row[3], row[4], row[5], bool(row[6]),
    )  # fmt: skip


SELECT_AGENT_SESSION = (
    "SELECT agent_session_id, human, agent, team, scopes, created_at, expires_at, revoked_at, revoked_by,"
    " revoke_reason FROM agent_sessions"
)


def agent_session_from_row(row: tuple[Any, ...]) -> AgentSessionRecord:
    return AgentSessionRecord(
        row[0], row[1], AgentId(row[2]), row[3], frozenset(json.loads(row[4])),
        from_us(row[5]), from_us(row[6]), maybe_from_us(row[7]), row[8], row[9],
    )  # fmt: skip


SELECT_CREDENTIAL = (
    "SELECT credential_id, agent_session_id, kind, digest, created_at, superseded_at, renewed_from"
    " FROM credentials"
)


def credential_from_row(row: tuple[Any, ...]) -> CredentialRecord:
    return CredentialRecord(
        row[0], row[1], CredentialKind(row[2]), row[3], from_us(row[4]), maybe_from_us(row[5]), row[6],
    )  # fmt: skip
