"""Revocation at one replica (DESIGN section 2 step 3): ending everything of an agent session here.

Owns the sessionless requests in flight per agent session (so a revocation cancels them too),
the revocations already applied (so the change feed never applies one twice), and the agent
sessions whose live calls were cut (answered with a typed error). Every revocation is audited.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import anyio

from bastion.audit.chain import CloseReason
from bastion.audit.entry import AuditEvent, Decision
from bastion.auth.principal import Principal
from bastion.errors import AgentSessionRevoked, BastionError, StoreError
from bastion.ids import AgentId
from bastion.replica.host import ReplicaHost
from bastion.store.base import AgentSessionRecord

__all__ = ["REVOCATION_SYNC_S", "Revocations"]

logger = logging.getLogger("bastion.gateway")

# A revocation, termination or policy reload made at another replica reaches this one within this
# bound: the change feed is read every POLL_INTERVAL_S (0.25 s), or at once on a notification (#10).
REVOCATION_SYNC_S = 1.0


class Revocations:
    """The revocations this replica applied, and the sessionless calls a revocation must cancel."""

    def __init__(self, host: ReplicaHost) -> None:
        self._host = host
        # Sessionless requests in flight, by agent session, so a revocation can cancel them too.
        self._sessionless_in_flight: dict[str, set[anyio.CancelScope]] = {}
        self._applied_revocations: set[str] = set()
        # Agent sessions whose live calls this gateway cut: those calls are answered with a typed error.
        self._cut_agent_sessions: set[str] = set()

    @contextlib.contextmanager
    def sessionless_call(self, principal: Principal, scope: anyio.CancelScope) -> Iterator[None]:
        """Track a sessionless request so revoking its agent session cancels it."""
        key = principal.agent_session_id
        if key is None:
            yield
            return
        self._sessionless_in_flight.setdefault(key, set()).add(scope)
        try:
            yield
        finally:
            scopes = self._sessionless_in_flight.get(key)
            if scopes is not None:
                scopes.discard(scope)
                if not scopes:
                    del self._sessionless_in_flight[key]

    def cut_cause(self, principal: Principal) -> BastionError | None:
        """Why the gateway cancelled this principal's calls (its agent session was revoked), or ``None``."""
        if principal.agent_session_id in self._cut_agent_sessions:
            return AgentSessionRevoked("Agent session revoked: this call was cut")
        return None

    async def end_agent_session(self, record: AgentSessionRecord) -> dict[str, Any]:
        """Apply a revocation here, at once: one audited operation that ends everything of that agent session.

        Its next request on any transport session is refused by the authenticator;
        this cancels its in-flight calls (an execution in flight ends
        ``outcome_unknown`` unless the upstream already answered), closes its
        upstream sessions and its evidence sessions (claims issued), and writes
        one ``revocation`` audit entry listing what it ended. Idempotent.
        """
        host = self._host
        self._cut_agent_sessions.add(record.agent_session_id)
        # Marked before the first await: the change feed may report this same revocation while it is
        # being applied here, and must not apply (and audit) it a second time.
        self._applied_revocations.add(record.agent_session_id)
        ended = [t for t in host.registry if t.principal.agent_session_id == record.agent_session_id]
        in_flight = sum(len(t.in_flight) for t in ended)
        evidence_closed: list[str] = []
        for transport_session in ended:
            if transport_session.evidence.session_id is not None:
                evidence_closed.append(transport_session.evidence.session_id)
            await host.close_transport_session(transport_session, CloseReason.REVOCATION.value)
        sessionless = self._sessionless_in_flight.pop(record.agent_session_id, set())
        for cancel_scope in sessionless:
            cancel_scope.cancel()
        with anyio.CancelScope(shield=True):  # its own stdio processes stop with it (issue 22)
            await host.fleet.agent_session_ended(record.agent, record.agent_session_id)
        if host.shared_evidence is not None:
            # Its sessionless requests' shared chain closes too, claim issued (after their outcomes).
            try:
                evidence_closed += await host.shared_evidence.close_agent_session(record.agent_session_id)
            except StoreError as exc:
                host.health.failed(exc)
        summary = {
            "agent_session_id": record.agent_session_id,
            "transport_sessions_closed": len(ended),
            "calls_cancelled": in_flight + len(sessionless),
            "evidence_sessions_closed": evidence_closed,
        }
        # Always audited, even when nothing was live here: the revocation itself is evidence.
        evidence = host.evidence_for(AgentId(record.agent))
        try:
            await evidence.record(
                AuditEvent.REVOCATION,
                decision=Decision.DENY.value,
                reason="agent_session_revoked",
                detail={
                    **summary,
                    "revoked_by": record.revoked_by,
                    "revoke_reason": record.revoke_reason,
                },
            )
            await evidence.close(CloseReason.REVOCATION)
        except StoreError as exc:
            host.health.failed(exc)
        logger.warning("agent session revoked: live sessions ended", extra=summary)
        return summary

    async def revoked_elsewhere(self, agent_session_id: str) -> None:
        """A revocation made anywhere (the change feed said so): end it here if this replica serves it."""
        host = self._host
        assert host.store is not None
        if agent_session_id in self._applied_revocations:
            return
        live = {t.principal.agent_session_id for t in host.registry} | set(self._sessionless_in_flight)
        if host.shared_evidence is not None:
            live |= host.shared_evidence.agent_sessions()
        if agent_session_id not in live:
            return
        record = await host.store.get_agent_session(agent_session_id)
        if record is not None and record.revoked_at is not None:
            await self.end_agent_session(record)
