"""The store contract of agent sessions and their credentials (DESIGN sections 1, 2 step 3 and 8).

Part of :class:`~bastion.store.base.Store`; the records are re-exported there.

Admin writes (create, add a credential, revoke, renew) carry **no** worker
fencing, by decision. Fencing keeps a superseded replica from writing over
state that its generation owned (executions, chains); an agent session
belongs to no generation, and each admin write is decided inside its own
transaction from committed rows alone, never from a replica's memory, so a
stale replica has nothing stale to write. Fencing revocation would only
make it fail at a stale replica, and a revocation refused is access kept:
the fail-open direction. What revocation needs is atomicity, and it has it:
one transaction records when, by whom and why, once; every later read sees
it. Who asked is in ``revoked_by``; the caller audits the operation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bastion.ids import AgentId

__all__ = ["AgentSessionRecord", "AgentSessionStore", "CredentialKind", "CredentialRecord"]


@dataclass(frozen=True, slots=True)
class AgentSessionRecord:
    """One agent session: the authorization context a credential resolves to.

    Revoked iff ``revoked_at`` is set (then ``revoked_by`` is too); expired iff
    ``now >= expires_at``. ``auth.agent_session.check_agent_session`` decides.
    """

    agent_session_id: str
    human: str
    agent: AgentId
    team: str | None
    scopes: frozenset[str]
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    revoke_reason: str | None


class CredentialKind(enum.StrEnum):
    """What a credential's ``digest`` is the SHA-256 of: a bearer token, or a client certificate (DER)."""

    BEARER = "bearer"
    MTLS = "mtls"


@dataclass(frozen=True, slots=True)
class CredentialRecord:
    """One credential bound to one agent session; ``digest`` is 64 lowercase hex digits.

    A superseded credential (``superseded_at`` set) authenticates nothing;
    ``renewed_from`` names the credential this one replaced.
    """

    credential_id: str
    agent_session_id: str
    kind: CredentialKind
    digest: str
    created_at: datetime
    superseded_at: datetime | None
    renewed_from: str | None


class AgentSessionStore(Protocol):
    """Agent sessions and credentials: unfenced admin writes, each one atomic transaction."""

    # ------------------------------------------------------------ agent sessions and credentials
    # Unfenced admin writes: see this module's docstring.

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
        """Create an agent session with a fresh random id, created at ``now``; it has no credential yet.

        Raises :class:`ValueError` if ``expires_at`` is not after ``now`` or a
        name is empty.
        """
        ...

    async def add_credential(
        self, agent_session_id: str, kind: CredentialKind, digest: str, *, now: datetime
    ) -> CredentialRecord:
        """Bind a new credential (fresh random id) to a live agent session, atomically with checking it.

        Raises :class:`ValueError` for a digest that is not 64 lowercase hex
        digits; :class:`Conflict` for an unknown agent session or a
        ``(kind, digest)`` ever used before; :class:`AgentSessionRevoked` or
        :class:`AgentSessionExpired` (as of ``now``) for a session that can no
        longer be used.
        """
        ...

    async def find_credential(
        self, kind: CredentialKind, digest: str
    ) -> tuple[CredentialRecord, AgentSessionRecord] | None:
        """The credential with this ``(kind, digest)`` and its agent session, read together; or ``None``.

        Superseded credentials are returned too (the caller refuses them), so
        that the audit can name the real cause.
        """
        ...

    async def get_agent_session(self, agent_session_id: str) -> AgentSessionRecord | None: ...

    async def list_agent_sessions(self, *, agent: AgentId | None = None) -> list[AgentSessionRecord]:
        """Every agent session (or only ``agent``'s), oldest first, revoked and expired ones included."""
        ...

    async def list_credentials(self, agent_session_id: str) -> list[CredentialRecord]:
        """The agent session's credentials, oldest first, superseded ones included."""
        ...

    async def revoke_agent_session(
        self, agent_session_id: str, *, by: str, reason: str, now: datetime
    ) -> AgentSessionRecord:
        """Revoke the agent session, atomically and once, and return its record.

        Idempotent: revoking a revoked session changes nothing and returns the
        first revocation (its time, actor and reason). An expired session can
        be revoked. Raises :class:`Conflict` for an unknown agent session and
        :class:`ValueError` for an empty ``by``.
        """
        ...

    async def renew_credential(
        self, old_credential_id: str, new_digest: str, *, now: datetime
    ) -> CredentialRecord:
        """Supersede ``old_credential_id`` at ``now`` and bind a new credential of the same kind, atomically.

        The old credential stops authenticating in the same transaction as the
        new one starts; the agent session (and any transport session) is
        unchanged: renewal extends nothing. A credential is renewed once:
        concurrent renewals of one credential have one winner. Raises
        :class:`ValueError` for a malformed digest; :class:`Conflict` for an
        unknown or already superseded credential, or a ``(kind, digest)`` used
        before; :class:`AgentSessionRevoked` / :class:`AgentSessionExpired`
        (as of ``now``) when its agent session can no longer be used.
        """
        ...
