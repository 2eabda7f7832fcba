"""Who is asking, for one request: the facts every step of a call may rely on.

Built by ``transport/`` after authentication and session lookup; read by
``call.py`` and ``methods.py``. It holds references, not copies, to the one
transport session (session era) so that nothing about one client can be
looked up through another's request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.ids import AgentId
from bastion.session.state import TransportSession
from bastion.upstream.base import CallRelay
from bastion.workers.attachment import owner_ref

__all__ = ["Caller"]


@dataclass(frozen=True)
class Caller:
    """The authenticated agent behind one request and the channel back to it."""

    agent: AgentId
    principal: Principal
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    transport_session: TransportSession | None  # None in the sessionless era
    relay: CallRelay | None
    evidence: EvidenceScope
    log_level: str | None = None
    # Sessionless era: the request's Mcp-Param-* headers (duplicates kept), checked against the tool.
    param_headers: Any = None

    @classmethod
    def of_transport_session(cls, transport_session: TransportSession) -> Caller:
        """The session era's caller: the transport session's own principal, version and chain."""
        return cls(
            agent=transport_session.agent,
            principal=transport_session.principal,
            protocol_version=transport_session.protocol_version,
            client_capabilities=transport_session.client_capabilities,
            transport_session=transport_session,
            relay=None,
            evidence=transport_session.evidence,
            log_level=transport_session.log_level,
        )

    @property
    def owner_ref(self) -> str:
        """Whoever its upstream state belongs to: its transport session, else its agent session (issue 22)."""
        transport_session = self.transport_session
        return owner_ref(
            transport_session.id if transport_session is not None else None,
            self.agent,
            self.principal.agent_session_id,
        )

    def with_relay(self, relay: CallRelay) -> Caller:
        """This caller answering through ``relay``: ``dataclasses.replace`` without its per-call
        field introspection (it profiled at 1-2% of a call). ``tests/unit/test_caller.py`` holds
        the two equal, so a new field cannot be dropped here unnoticed."""
        return Caller(
            self.agent,
            self.principal,
            self.protocol_version,
            self.client_capabilities,
            self.transport_session,
            relay,
            self.evidence,
            self.log_level,
            self.param_headers,
        )
