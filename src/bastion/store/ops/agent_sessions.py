"""Operations on agent sessions and credentials (unfenced admin writes: see store/base.py).

Revocation and supersession are ``UPDATE ... WHERE ... IS NULL``: the first
one wins in every engine. A renewal reads the old credential ``FOR UPDATE``
(PostgreSQL), so concurrent renewals of one credential have one winner.
"""

from __future__ import annotations

import secrets
from datetime import datetime

from bastion.errors import AgentSessionExpired, AgentSessionRevoked, Conflict
from bastion.ids import AgentId
from bastion.store.base import AgentSessionRecord, CredentialKind, CredentialRecord
from bastion.store.rows import (
    SELECT_AGENT_SESSION,
    SELECT_CREDENTIAL,
    agent_session_from_row,
    credential_from_row,
)
from bastion.store.statements import Op, execute, one, rows


def select_agent_session(agent_session_id: str, *, lock: str = "") -> Op[AgentSessionRecord | None]:
    row = yield from one(SELECT_AGENT_SESSION + " WHERE agent_session_id = ?", agent_session_id, lock=lock)
    return None if row is None else agent_session_from_row(row)


def usable_agent_session(agent_session_id: str, now: datetime, *, lock: str = "FOR SHARE") -> Op[None]:
    """Raise unless the agent session exists, is not revoked and has not expired at ``now``."""
    record = yield from select_agent_session(agent_session_id, lock=lock)
    if record is None:
        raise Conflict("unknown agent session", agent_session_id=agent_session_id)
    if record.revoked_at is not None:
        raise AgentSessionRevoked()
    if now >= record.expires_at:
        raise AgentSessionExpired()


def create_agent_session(
    agent_session_id: str,
    human: str,
    agent: AgentId,
    team: str | None,
    scopes_json: str,
    created_us: int,
    expires_us: int,
) -> Op[AgentSessionRecord]:
    yield from execute(
        "INSERT INTO agent_sessions (agent_session_id, human, agent, team, scopes, created_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        agent_session_id, human, agent, team, scopes_json, created_us, expires_us,
    )  # fmt: skip
    return (yield from select_agent_session(agent_session_id))  # type: ignore[return-value]


def insert_credential(
    agent_session_id: str, kind: CredentialKind, digest: str, now_us: int, renewed_from: str | None
) -> Op[CredentialRecord]:
    if (yield from one("SELECT 1 FROM credentials WHERE kind = ? AND digest = ?", kind.value, digest)):
        raise Conflict("this credential was bound before", kind=kind.value)
    credential_id = "cred_" + secrets.token_hex(12)
    yield from execute(
        "INSERT INTO credentials (credential_id, agent_session_id, kind, digest, created_at, superseded_at,"
        " renewed_from) VALUES (?, ?, ?, ?, ?, NULL, ?)",
        credential_id, agent_session_id, kind.value, digest, now_us, renewed_from,
    )  # fmt: skip
    row = yield from one(SELECT_CREDENTIAL + " WHERE credential_id = ?", credential_id)
    assert row is not None
    return credential_from_row(row)


def add_credential(
    agent_session_id: str, kind: CredentialKind, digest: str, now: datetime, now_us: int
) -> Op[CredentialRecord]:
    yield from usable_agent_session(agent_session_id, now)
    return (yield from insert_credential(agent_session_id, kind, digest, now_us, None))


def find_credential(
    kind: CredentialKind, digest: str
) -> Op[tuple[CredentialRecord, AgentSessionRecord] | None]:
    row = yield from one(SELECT_CREDENTIAL + " WHERE kind = ? AND digest = ?", kind.value, digest)
    if row is None:
        return None
    credential = credential_from_row(row)
    # Engines run this in one read transaction: the pair is consistent.
    agent_session = yield from select_agent_session(credential.agent_session_id)
    assert agent_session is not None  # the foreign key guarantees it
    return credential, agent_session


def list_agent_sessions(agent: AgentId | None) -> Op[list[AgentSessionRecord]]:
    if agent is None:
        found = yield from rows(SELECT_AGENT_SESSION + " ORDER BY created_at, agent_session_id")
    else:
        found = yield from rows(
            SELECT_AGENT_SESSION + " WHERE agent = ? ORDER BY created_at, agent_session_id", agent
        )
    return [agent_session_from_row(row) for row in found]


def list_credentials(agent_session_id: str) -> Op[list[CredentialRecord]]:
    found = yield from rows(
        SELECT_CREDENTIAL + " WHERE agent_session_id = ? ORDER BY created_at, rowid", agent_session_id
    )
    return [credential_from_row(row) for row in found]


def revoke_agent_session(agent_session_id: str, by: str, reason: str, now_us: int) -> Op[AgentSessionRecord]:
    # The first revocation wins; a later one records nothing over it.
    yield from execute(
        "UPDATE agent_sessions SET revoked_at = ?, revoked_by = ?, revoke_reason = ?"
        " WHERE agent_session_id = ? AND revoked_at IS NULL",
        now_us, by, reason, agent_session_id,
    )  # fmt: skip
    record = yield from select_agent_session(agent_session_id)
    if record is None:
        raise Conflict("unknown agent session", agent_session_id=agent_session_id)
    return record


def renew_credential(
    old_credential_id: str, new_digest: str, now: datetime, now_us: int
) -> Op[CredentialRecord]:
    row = yield from one(SELECT_CREDENTIAL + " WHERE credential_id = ?", old_credential_id, lock="FOR UPDATE")
    if row is None:
        raise Conflict("unknown credential", credential_id=old_credential_id)
    old = credential_from_row(row)
    if old.superseded_at is not None:
        raise Conflict("the credential was already superseded", credential_id=old_credential_id)
    yield from usable_agent_session(old.agent_session_id, now)
    yield from execute(
        "UPDATE credentials SET superseded_at = ? WHERE credential_id = ?", now_us, old_credential_id
    )
    return (
        yield from insert_credential(old.agent_session_id, old.kind, new_digest, now_us, old_credential_id)
    )
