"""Who a request comes from, after authentication (DESIGN sections 1 and 2 step 2).

A :class:`Principal` is what every authenticator returns: the agent, and,
when the credential is bound to one, the agent session (the authorization
context: human, team, consented scopes, expiry, revocation). Static agents
from the configuration have no agent session. The transport session keeps
the principal it was opened with; every call re-checks the agent session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from bastion.ids import AgentId

__all__ = ["Principal"]


@dataclass(frozen=True)
class Principal:
    agent: AgentId
    agent_session_id: str | None = None
    human: str | None = None
    team: str | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)
    credential_id: str | None = None
    expires_at: datetime | None = None
