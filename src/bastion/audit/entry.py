"""The typed audit entry and its hash (DESIGN section 4).

Every field is always serialized, ``null`` included, in this fixed set:
``seq, ts, session_id, call_id, workflow_id, execution_id, agent, event,
server, tool, args_digest, binding, decision, reason, outcome,
policy_version, worker, epoch, detail, prev, hash``.

``hash = SHA-256(bytes.fromhex(prev) || JCS(entry without "hash"))`` where JCS
is RFC 8785 canonical JSON. The genesis entry of a chain has ``seq = 0`` and
``prev = GENESIS_PREV`` (64 zeros); its ``detail`` commits to the signing key
id and a random nonce, so the chain root (its hash) is unique per session.

This module is pure: no I/O, no sockets, no database. The offline verifier
imports it.
"""

from __future__ import annotations

import enum
import hashlib
import operator
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bastion.crypto.jcs import canonical_json

__all__ = [
    "ENTRY_FIELDS",
    "GENESIS_PREV",
    "AuditEntry",
    "AuditEvent",
    "Decision",
    "compute_hash",
    "digest_json",
    "format_ts",
]

GENESIS_PREV = "0" * 64


class AuditEvent(enum.StrEnum):
    SESSION_OPEN = "session_open"
    SESSION_CLOSE = "session_close"
    ADMITTED = "admitted"
    REFUSED = "refused"
    INVOKING = "invoking"
    COMPLETED = "completed"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RELEASED = "released"
    COLLISION = "collision"
    REPLAY = "replay"
    ISOLATION_REFUSED = "isolation_refused"
    RECOVERY = "recovery"
    REVOCATION = "revocation"
    INPUT_REQUIRED = "input_required"  # a round of a call that asked its client for input (issue #8)
    # Step-up approval of one call (issue 27): asked, then exactly one of the four answers.
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_TIMED_OUT = "approval_timed_out"
    APPROVAL_CANCELLED = "approval_cancelled"
    DEFINITION_CHANGED = "definition_changed"  # an upstream definition differs from its pin (issue 27)
    PIN_DECIDED = "pin_decided"  # an operator approved or rejected a changed definition (issue 27)
    # A task an upstream created for a call, and what became of it (issue 24, tasks/relay.py).
    TASK_CREATED = "task_created"
    TASK_STATUS = "task_status"
    TASK_RESULT = "task_result"
    TASK_CANCEL = "task_cancel"
    TASK_UPDATE = "task_update"  # the tasks extension's inputResponses delivered (by digest)


class Decision(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One link of an evidence session's chain. Build unsealed (``hash=None``), then :meth:`seal`."""

    seq: int
    ts: str
    session_id: str
    call_id: str | None
    workflow_id: str | None
    execution_id: str | None
    agent: str | None
    event: str
    server: str | None
    tool: str | None
    args_digest: str | None
    binding: str | None
    decision: str | None
    reason: str | None
    outcome: str | None
    policy_version: str | None
    worker: str | None
    epoch: int | None
    detail: dict[str, Any] | None
    prev: str
    hash: str | None = None

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``, the object that is hashed.

        Shallow on purpose (``asdict`` deep-copies ``detail``, which is never mutated
        after construction): this runs for every entry on the hot path.
        """
        return dict(zip(_BODY_FIELDS, _body_values(self), strict=True))

    def to_json(self) -> dict[str, Any]:
        """Every field, ``hash`` included, as it is exported."""
        return dict(zip(ENTRY_FIELDS, _entry_values(self), strict=True))

    def seal(self) -> AuditEntry:
        """This entry with its ``hash`` computed over its body and ``prev``."""
        body = self.body()
        return AuditEntry(**body, hash=compute_hash(self.prev, body))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AuditEntry:
        """Build from an exported object; raises ``KeyError``/``TypeError`` on a missing or extra field."""
        if set(data) != set(ENTRY_FIELDS):
            missing = sorted(set(ENTRY_FIELDS) - set(data))
            extra = sorted(set(data) - set(ENTRY_FIELDS))
            raise KeyError(f"entry fields differ: missing={missing} extra={extra}")
        return cls(**data)


ENTRY_FIELDS: tuple[str, ...] = tuple(AuditEntry.__dataclass_fields__)
_BODY_FIELDS: tuple[str, ...] = tuple(name for name in ENTRY_FIELDS if name != "hash")
_entry_values = operator.attrgetter(*ENTRY_FIELDS)
_body_values = operator.attrgetter(*_BODY_FIELDS)


def compute_hash(prev: str, body: dict[str, Any]) -> str:
    """``SHA-256(bytes.fromhex(prev) || JCS(body))`` as lowercase hex."""
    h = hashlib.sha256(bytes.fromhex(prev))
    h.update(canonical_json(body))
    return h.hexdigest()


def digest_json(value: Any) -> str:
    """``sha256:<hex>`` of the RFC 8785 canonical JSON of ``value`` (arguments, results)."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


# What format_ts writes, as a verifier checks it: ASCII digits only (``\d`` in a str
# pattern also matches other scripts' digits).
TS_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def format_ts(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, the one timestamp format of the chain."""
    # Same text as strftime("%Y-%m-%dT%H:%M:%S.%fZ"), at a fraction of the cost.
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
