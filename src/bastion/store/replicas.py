"""The store's share of making replicas interchangeable (DESIGN sections 1, 5 and 7; issue #10).

This module owns the contract (a :class:`ReplicaRecords` protocol that
:class:`~bastion.store.base.Store` extends) and its records:

- **Front transport sessions as records.** A session-era ``Mcp-Session-Id``
  minted at one replica is written here before the client learns it (owner
  agent and credential, negotiated version, client capabilities and info), so
  any replica can load it on a miss, check its owner and serve it. The id is a
  bearer of the session and is never stored: rows are keyed by its SHA-256
  (:func:`transport_session_key`). Idle expiry is shared: replicas touch
  ``last_seen_at`` in batches; termination (DELETE, shared idle expiry,
  revocation) is written once and read everywhere.
- **The change feed.** An ordered table of small facts every replica must
  apply within a second: an agent session revoked, a transport session
  terminated, a cancellation or a client's answer that reached a replica other
  than the one holding the request, a policy reload. Revocations and
  terminations enter it inside the transaction that made them (a trigger), so
  no writer (admin API, CLI, another replica) can forget to announce them.
- **Policy reports.** Each replica reports the snapshot version it runs, so
  ``/readyz`` and ``bastion workers`` can show one that is behind.

Nothing here names an engine.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from bastion.ids import AgentId, Epoch, WorkerId

__all__ = [
    "Change",
    "ChangeKind",
    "PolicyReport",
    "ReplicaRecords",
    "TransportSessionRecord",
    "transport_session_key",
]


def transport_session_key(transport_session_id: str) -> str:
    """The store key of a transport session: SHA-256 of its id (the id itself is never stored)."""
    return hashlib.sha256(transport_session_id.encode()).hexdigest()


class ChangeKind(enum.StrEnum):
    """What a change announces; ``subject`` names what it is about."""

    AGENT_SESSION_REVOKED = "agent_session_revoked"  # subject: agent_session_id
    TRANSPORT_SESSION_TERMINATED = "transport_session_terminated"  # subject: session key; detail: reason
    REQUEST_CANCELLED = "request_cancelled"  # subject: session key; detail: {request_id}
    CLIENT_REPLIED = "client_replied"  # subject: session key; detail: {relay_id, reply}
    POLICY_RELOADED = "policy_reloaded"  # subject: policy version
    APPROVAL_DECIDED = "approval_decided"  # subject: approval_id (issue 27; written by decide_approval)
    PINS_CHANGED = "pins_changed"  # subject: server; detail: {kind, name, digest, approved} (issue 27)


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the change feed. ``seq`` rises strictly; ``origin`` is the publishing worker, if any."""

    seq: int
    kind: ChangeKind
    subject: str
    detail: Mapping[str, Any] | None
    origin: WorkerId | None
    at: datetime


@dataclass(frozen=True, slots=True)
class TransportSessionRecord:
    """One front transport session, as stored.

    ``key`` is :func:`transport_session_key` of the ``Mcp-Session-Id``.
    The owner is the principal that opened it: ``agent`` and ``credential_id``
    (``None`` for a static agent token). It is usable while ``terminated_at``
    is unset and ``last_seen_at`` is younger than the idle timeout.
    """

    key: str
    agent: AgentId
    agent_session_id: str | None
    credential_id: str | None
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any]
    created_at: datetime
    last_seen_at: datetime
    created_by: WorkerId
    terminated_at: datetime | None = None
    terminate_reason: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """The snapshot version a gateway worker runs, and its last reload error, as of ``reported_at``."""

    worker_id: WorkerId
    policy_version: str
    reload_error: str | None
    reported_at: datetime


class ReplicaRecords(Protocol):
    """Transport sessions, the change feed and policy reports: each write one atomic transaction."""

    async def create_transport_session(
        self, record: TransportSessionRecord, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        """Insert a new transport session, fenced by ``(writer, epoch)``.

        Raises :class:`StaleEpoch` (stale writer) or :class:`Conflict` (the key exists: never reused).
        """
        ...

    async def get_transport_session(self, key: str) -> TransportSessionRecord | None:
        """The record under ``key``, terminated or not; ``None`` if never created."""
        ...

    async def list_transport_sessions(self, *, seen_since: datetime) -> list[TransportSessionRecord]:
        """Every record not terminated and seen at or after ``seen_since``, oldest first (issue #26)."""
        ...

    async def touch_transport_sessions(
        self, keys: Sequence[str], now: datetime, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        """Move ``last_seen_at`` of live sessions forward to ``now`` (never back), in one transaction.

        Terminated and unknown keys are left alone. Fenced: raises :class:`StaleEpoch`.
        """
        ...

    async def terminate_transport_session(self, key: str, reason: str, now: datetime) -> bool:
        """End the session everywhere; returns whether this call ended it (the first termination wins).

        Unfenced by decision, like revocation: it only ever removes access.
        The termination enters the change feed in the same transaction.
        """
        ...

    async def publish_change(
        self, kind: ChangeKind, subject: str, detail: Mapping[str, Any] | None, *, origin: WorkerId
    ) -> int:
        """Append one change to the feed and return its ``seq``."""
        ...

    async def changes_after(self, seq: int, *, limit: int = 500) -> list[Change]:
        """Changes with ``seq`` greater than ``seq``, oldest first, at most ``limit``."""
        ...

    async def latest_change(self) -> int:
        """The highest ``seq`` so far (0 when the feed is empty): where a new follower starts."""
        ...

    async def prune_changes(self, before: datetime) -> int:
        """Drop changes, and transport sessions ended or idle, older than ``before``; returns rows."""
        ...

    async def report_policy(
        self,
        version: str,
        reload_error: str | None,
        now: datetime,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> None:
        """Record the snapshot version ``writer`` runs (and its last reload error). Fenced."""
        ...

    async def list_policy_reports(self) -> list[PolicyReport]:
        """Every gateway worker's latest report, oldest first."""
        ...
