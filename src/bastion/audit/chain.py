"""Building one evidence session's audit chain, in memory (DESIGN section 4).

Pure: no I/O, no clock, no store. The store calls these inside its append
transaction (read the head row, build the next entry, insert it), and
:class:`ChainBuilder` does the same in memory for tests and tools.

The shape of every chain:

* **seq 0, the genesis** (event ``session_open``, ``prev`` = 64 zeros). Its
  fields carry the session and the agent; its ``detail`` is exactly
  ``{"key_id": <signing key id>, "nonce": <32 random bytes, base64url>}``. All
  call fields are ``null``. Its hash is the **chain root**.
* **seq 1, the attestation** (event ``session_open``, ``detail`` exactly
  ``{"attestation": <record>}``): the result of binding the root into TEE
  ``report_data`` (``tee.py``), or a ``kind: none`` record saying why not. It
  cannot live in the genesis, because it is made from the genesis hash.
* **seq 2...**, the session's entries, each ``seq + 1`` with ``prev`` = the
  previous ``hash``.
* **the close** (event ``session_close``, ``detail`` exactly
  ``{"close_reason": <CloseReason>}``), after which nothing is appended; the
  TRACE claim is issued from the closed chain (``claim.py``).

Every entry has the session's ``session_id``. The offline verifier
(``verify.py``) enforces exactly these rules.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bastion.audit.entry import GENESIS_PREV, AuditEntry, AuditEvent, format_ts
from bastion.audit.tee import check_attestation_record

__all__ = [
    "ATTESTATION_SEQ",
    "GENESIS_SEQ",
    "ChainBuilder",
    "ChainSummary",
    "CloseReason",
    "attestation_entry",
    "close_entry",
    "link_entry",
    "make_genesis",
    "new_chain_nonce",
    "next_entry",
]

GENESIS_SEQ = 0
ATTESTATION_SEQ = 1


class CloseReason(enum.StrEnum):
    """Why an evidence session closed; recorded in its close entry and its claim."""

    CLIENT_DELETE = "client_delete"
    IDLE_EXPIRY = "idle_expiry"
    ROTATION = "rotation"
    SHUTDOWN = "shutdown"
    RECOVERY = "recovery"
    REVOCATION = "revocation"
    REQUEST_END = "request_end"  # a sessionless request's own evidence session, closed with it


def new_chain_nonce() -> str:
    """32 random bytes, unpadded base64url: the genesis nonce that makes every root unique."""
    return secrets.token_urlsafe(32)


def make_genesis(
    *,
    session_id: str,
    agent: str,
    key_id: str,
    at: datetime,
    nonce: str | None = None,
    policy_version: str | None = None,
    worker: str | None = None,
    epoch: int | None = None,
) -> AuditEntry:
    """The sealed genesis entry (seq 0) of a new evidence session; its hash is the chain root.

    Raises ``ValueError`` for an empty session id, agent or key id.
    """
    if not session_id or not agent or not key_id:
        raise ValueError("genesis needs a session id, an agent and a key id")
    return AuditEntry(
        seq=GENESIS_SEQ,
        ts=format_ts(at),
        session_id=session_id,
        call_id=None,
        workflow_id=None,
        execution_id=None,
        agent=agent,
        event=AuditEvent.SESSION_OPEN.value,
        server=None,
        tool=None,
        args_digest=None,
        binding=None,
        decision=None,
        reason=None,
        outcome=None,
        policy_version=policy_version,
        worker=worker,
        epoch=epoch,
        detail={"key_id": key_id, "nonce": nonce if nonce is not None else new_chain_nonce()},
        prev=GENESIS_PREV,
    ).seal()


def next_entry(
    previous: AuditEntry,
    *,
    event: AuditEvent,
    at: datetime,
    agent: str | None = None,
    call_id: str | None = None,
    workflow_id: str | None = None,
    execution_id: str | None = None,
    server: str | None = None,
    tool: str | None = None,
    args_digest: str | None = None,
    binding: str | None = None,
    decision: str | None = None,
    reason: str | None = None,
    outcome: str | None = None,
    policy_version: str | None = None,
    worker: str | None = None,
    epoch: int | None = None,
    detail: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """The sealed entry after ``previous``: ``seq + 1``, ``prev`` = its hash, same session.

    ``agent`` defaults to the previous entry's agent. Raises ``ValueError`` if
    ``previous`` is unsealed or is a close entry, and the JCS error if
    ``detail`` has no RFC 8785 form.
    """
    if previous.hash is None:
        raise ValueError("previous entry is not sealed")
    if previous.event == AuditEvent.SESSION_CLOSE:
        raise ValueError("the evidence session is closed; nothing follows its close entry")
    return link_entry(
        previous.seq + 1,
        previous.hash,
        previous.session_id,
        agent if agent is not None else previous.agent,
        event=event,
        at=at,
        call_id=call_id,
        workflow_id=workflow_id,
        execution_id=execution_id,
        server=server,
        tool=tool,
        args_digest=args_digest,
        binding=binding,
        decision=decision,
        reason=reason,
        outcome=outcome,
        policy_version=policy_version,
        worker=worker,
        epoch=epoch,
        detail=detail,
    )


def link_entry(
    seq: int,
    prev: str,
    session_id: str,
    agent: str | None,
    *,
    event: AuditEvent,
    at: datetime,
    call_id: str | None = None,
    workflow_id: str | None = None,
    execution_id: str | None = None,
    server: str | None = None,
    tool: str | None = None,
    args_digest: str | None = None,
    binding: str | None = None,
    decision: str | None = None,
    reason: str | None = None,
    outcome: str | None = None,
    policy_version: str | None = None,
    worker: str | None = None,
    epoch: int | None = None,
    detail: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """The sealed entry at ``seq`` after the link whose hash is ``prev``.

    For builders that know the head only as ``(seq, hash)`` (the store's append
    transaction). Raises the JCS error if ``detail`` has no RFC 8785 form.
    """
    body_detail = dict(detail) if detail is not None else None
    # What could never be hashed or verified is refused by seal(), which canonicalizes the body,
    # detail included: before the entry exists anywhere (issue 28: once, not twice).
    return AuditEntry(
        seq=seq,
        ts=format_ts(at),
        session_id=session_id,
        call_id=call_id,
        workflow_id=workflow_id,
        execution_id=execution_id,
        agent=agent,
        event=AuditEvent(event).value,
        server=server,
        tool=tool,
        args_digest=args_digest,
        binding=binding,
        decision=decision,
        reason=reason,
        outcome=outcome,
        policy_version=policy_version,
        worker=worker,
        epoch=epoch,
        detail=body_detail,
        prev=prev,
    ).seal()


def attestation_entry(
    genesis: AuditEntry,
    attestation: Mapping[str, Any],
    *,
    at: datetime,
    worker: str | None = None,
    epoch: int | None = None,
) -> AuditEntry:
    """Entry seq 1: the attestation record that binds (or fails to bind) the chain root.

    Raises ``ValueError`` if ``genesis`` is not a sealed seq-0 entry or the
    record is malformed or binds another root.
    """
    if genesis.seq != GENESIS_SEQ or genesis.hash is None:
        raise ValueError("the attestation entry follows a sealed genesis entry")
    record = dict(attestation)
    check_attestation_record(record, genesis.hash)
    return next_entry(
        genesis,
        event=AuditEvent.SESSION_OPEN,
        at=at,
        policy_version=genesis.policy_version,
        worker=worker,
        epoch=epoch,
        detail={"attestation": record},
    )


def close_entry(
    previous: AuditEntry,
    reason: CloseReason,
    *,
    at: datetime,
    worker: str | None = None,
    epoch: int | None = None,
) -> AuditEntry:
    """The close entry (event ``session_close``): the last entry of the chain."""
    return next_entry(
        previous,
        event=AuditEvent.SESSION_CLOSE,
        at=at,
        worker=worker,
        epoch=epoch,
        detail={"close_reason": CloseReason(reason).value},
    )


@dataclass(frozen=True, slots=True)
class ChainSummary:
    """What a TRACE claim states about a chain; made by the builder or the verifier.

    ``attestation`` is ``None`` for a chain that has only its genesis, and
    ``close_reason`` is ``None`` until the close entry is appended. Holds no
    execution id, by construction.
    """

    session_id: str
    agent: str
    key_id: str
    root: str
    head: str
    entry_count: int
    first_ts: str
    last_ts: str
    attestation: dict[str, Any] | None
    close_reason: CloseReason | None

    @classmethod
    def of(cls, genesis: AuditEntry, attestation: AuditEntry | None, head: AuditEntry) -> ChainSummary:
        """The summary of a chain from its genesis, its attestation entry and its head.

        Raises ``ValueError`` if they are not entries of one sealed chain of this shape.
        """
        if genesis.seq != GENESIS_SEQ or genesis.hash is None or head.hash is None:
            raise ValueError("summary needs a sealed genesis and a sealed head")
        if genesis.detail is None or not isinstance(genesis.detail.get("key_id"), str) or not genesis.agent:
            raise ValueError("genesis entry lacks its key id or agent")
        if head.session_id != genesis.session_id:
            raise ValueError("head belongs to another session")
        record: dict[str, Any] | None = None
        if attestation is not None:
            if attestation.seq != ATTESTATION_SEQ or attestation.detail is None:
                raise ValueError("the attestation entry is seq 1 and holds the attestation record")
            record = attestation.detail["attestation"]
        close_reason = None
        if head.event == AuditEvent.SESSION_CLOSE and head.detail is not None:
            close_reason = CloseReason(head.detail["close_reason"])
        return cls(
            session_id=genesis.session_id,
            agent=genesis.agent,
            key_id=genesis.detail["key_id"],
            root=genesis.hash,
            head=head.hash,
            entry_count=head.seq + 1,
            first_ts=genesis.ts,
            last_ts=head.ts,
            attestation=record,
            close_reason=close_reason,
        )


class ChainBuilder:
    """One evidence session's chain, built in memory: genesis, attestation, entries, close."""

    __slots__ = ("_attestation", "_entries", "_genesis", "_head", "_root")

    def __init__(self, genesis: AuditEntry) -> None:
        if genesis.seq != GENESIS_SEQ or genesis.hash is None:
            raise ValueError("a chain starts from a sealed genesis entry")
        self._genesis = genesis
        self._root: str = genesis.hash
        self._head = genesis
        self._attestation: AuditEntry | None = None
        self._entries: list[AuditEntry] = [genesis]

    @classmethod
    def open(
        cls,
        *,
        session_id: str,
        agent: str,
        key_id: str,
        at: datetime,
        nonce: str | None = None,
        policy_version: str | None = None,
    ) -> ChainBuilder:
        """A new chain holding its genesis entry (see :func:`make_genesis`)."""
        return cls(
            make_genesis(
                session_id=session_id,
                agent=agent,
                key_id=key_id,
                at=at,
                nonce=nonce,
                policy_version=policy_version,
            )
        )

    @property
    def root(self) -> str:
        """The chain root: the genesis hash, to bind into TEE ``report_data``."""
        return self._root

    @property
    def head(self) -> AuditEntry:
        """The last entry appended."""
        return self._head

    @property
    def entries(self) -> tuple[AuditEntry, ...]:
        """Every entry so far, in order."""
        return tuple(self._entries)

    def bind_attestation(self, attestation: Mapping[str, Any], *, at: datetime) -> AuditEntry:
        """Append entry seq 1 (see :func:`attestation_entry`); raises ``ValueError`` if not next."""
        if self._head is not self._genesis:
            raise ValueError("the attestation entry directly follows the genesis")
        entry = attestation_entry(self._genesis, attestation, at=at)
        self._attestation = entry
        return self._push(entry)

    def append(self, event: AuditEvent, *, at: datetime, **fields: Any) -> AuditEntry:
        """Append the next entry (see :func:`next_entry` for ``fields``).

        Raises ``ValueError`` before the attestation entry, for a session event
        (use :meth:`bind_attestation` and :meth:`close`), or after the close.
        """
        if self._attestation is None:
            raise ValueError("bind the attestation (seq 1) before appending entries")
        if event in (AuditEvent.SESSION_OPEN, AuditEvent.SESSION_CLOSE):
            raise ValueError(f"{event.value} entries are made by bind_attestation() and close()")
        return self._push(next_entry(self._head, event=event, at=at, **fields))

    def close(self, reason: CloseReason, *, at: datetime) -> AuditEntry:
        """Append the close entry; nothing can be appended after it."""
        if self._attestation is None:
            raise ValueError("bind the attestation (seq 1) before closing")
        return self._push(close_entry(self._head, reason, at=at))

    def summary(self) -> ChainSummary:
        """What a claim over the chain so far would state."""
        return ChainSummary.of(self._genesis, self._attestation, self._head)

    def _push(self, entry: AuditEntry) -> AuditEntry:
        self._entries.append(entry)
        self._head = entry
        return entry
