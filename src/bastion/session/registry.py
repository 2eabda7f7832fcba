"""The registry of live transport sessions (DESIGN sections 1 and 5).

Owns minting, finding, terminating and expiring session-era transport
sessions. A lookup names the caller: a session presented by another agent is
answered exactly as an unknown one (``SessionNotFound``), and the real cause
is kept on the exception for the audit. There is no fallback to a "current"
session, ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.errors import SessionNotFound, TooManySessions
from bastion.ids import AgentId, TransportSessionId, new_transport_session_id
from bastion.session.replay import ReplayLimits, SessionStreams
from bastion.session.server_channel import ServerChannel, TaskStatusHook
from bastion.session.state import InFlightCall, TransportSession
from bastion.store.replicas import transport_session_key

__all__ = ["SessionRegistry"]


class SessionRegistry:
    """Live transport sessions of this gateway process."""

    def __init__(
        self,
        *,
        idle_timeout_s: float,
        max_sessions: int,
        max_sessions_per_agent: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        mint_id: Callable[[], TransportSessionId] = new_transport_session_id,
        replay_limits: ReplayLimits | None = None,
    ) -> None:
        self._replay_limits = replay_limits or ReplayLimits()
        self._sessions: dict[TransportSessionId, TransportSession] = {}
        # One agent must not lock every other agent out (issue #12): a share of the global cap each.
        self._max_per_agent = max_sessions if max_sessions_per_agent is None else max_sessions_per_agent
        self._per_agent: dict[AgentId, int] = {}
        self._idle_timeout_s = idle_timeout_s
        self._max_sessions = max_sessions
        self._clock = clock
        self._mint_id = mint_id
        # Sessions used since the last flush: their shared idle expiry is moved on in one batch (#10).
        self._touched: set[TransportSessionId] = set()
        self._by_key: dict[str, TransportSessionId] = {}
        # Set by the gateway (tasks/relay.py): an upstream's task status, mapped for its owner.
        self.task_status: TaskStatusHook | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[TransportSession]:
        return iter(list(self._sessions.values()))

    def create(
        self,
        principal: Principal,
        protocol_version: str,
        client_capabilities: Mapping[str, Any],
        client_info: Mapping[str, Any],
        evidence: EvidenceScope,
    ) -> TransportSession:
        """Mint a new session for ``agent``; ids are random and never reused.

        Raises:
            TooManySessions: this agent holds its share of transport sessions already.
        """
        held = self._per_agent.get(principal.agent, 0)
        if held >= self._max_per_agent:
            raise TooManySessions(
                "Service Unavailable: too many transport sessions for this agent", cause="agent_cap"
            )
        session_id = self._mint_id()
        while session_id in self._sessions:  # pragma: no cover - 192 random bits
            session_id = self._mint_id()
        transport_session = self.new_session(
            session_id, principal, protocol_version, client_capabilities, client_info, evidence
        )
        self._sessions[session_id] = transport_session
        self._by_key[transport_session_key(session_id)] = session_id
        self._per_agent[principal.agent] = held + 1
        return transport_session

    def at_capacity(self) -> bool:
        return len(self._sessions) >= self._max_sessions

    def get(self, session_id: str, principal: Principal) -> TransportSession:
        """The live session ``session_id`` created by this principal (same agent, same credential).

        A renewed or different credential of the same agent does not reach a
        session opened with the old one: that session stays bound to its
        credential's rules.

        Raises:
            SessionNotFound: unknown, terminated, idle-expired, or created by another agent;
                ``data`` is empty on the wire, the cause is in ``exc.cause``.
        """
        transport_session = self._sessions.get(TransportSessionId(session_id))
        cause: str | None = None
        if transport_session is None:
            cause = "unknown"
        elif (
            transport_session.agent != principal.agent
            or transport_session.principal.credential_id != principal.credential_id
        ):
            cause = "foreign"
        elif self._clock() - transport_session.last_seen > self._idle_timeout_s:
            cause = "expired"
        if cause is not None or transport_session is None:
            raise SessionNotFound(cause=cause)
        transport_session.last_seen = self._clock()
        self._touched.add(transport_session.id)
        return transport_session

    def adopt(self, transport_session: TransportSession) -> TransportSession:
        """Hold a session loaded from the store (opened at another replica); an equal id held already wins."""
        held = self._sessions.setdefault(transport_session.id, transport_session)
        if held is transport_session:
            self._by_key[transport_session_key(held.id)] = held.id
            self._per_agent[held.agent] = self._per_agent.get(held.agent, 0) + 1
        self._touched.add(held.id)
        return held

    def by_key(self, key: str) -> TransportSession | None:
        """The session held here whose store key (``store.replicas.transport_session_key``) is ``key``."""
        session_id = self._by_key.get(key)
        return None if session_id is None else self._sessions.get(session_id)

    def take_touched(self) -> list[TransportSessionId]:
        """The ids of live sessions used since the last call, and forget them."""
        touched = [i for i in self._touched if i in self._sessions]
        self._touched.clear()
        return touched

    def new_session(
        self,
        session_id: TransportSessionId,
        principal: Principal,
        protocol_version: str,
        client_capabilities: Mapping[str, Any],
        client_info: Mapping[str, Any],
        evidence: EvidenceScope,
    ) -> TransportSession:
        """A session record for ``session_id``, not yet held (``create`` and ``adopt`` hold it)."""
        now = self._clock()
        record = TransportSession(
            id=session_id,
            agent=principal.agent,
            principal=principal,
            protocol_version=protocol_version,
            client_capabilities=dict(client_capabilities),
            client_info=dict(client_info),
            created_at=now,
            last_seen=now,
            evidence=evidence,
            streams=SessionStreams(self._replay_limits),
        )
        # What its own upstream sessions send outside a request reaches it here (issue 22).
        record.upstream_sessions.channel = ServerChannel(record, self._task_status)
        return record

    async def _task_status(
        self, transport_session: TransportSession, server: str, params: dict[str, Any]
    ) -> dict[str, Any] | None:
        hook = self.task_status
        return None if hook is None else await hook(transport_session, server, params)

    def remove(self, transport_session: TransportSession) -> list[InFlightCall]:
        """Forget the session and cancel its requests; returns them, so the caller can await their end."""
        calls = list(transport_session.in_flight.values())
        transport_session.terminated = True
        transport_session.cancel_all()
        if self._sessions.get(transport_session.id) is transport_session:
            del self._sessions[transport_session.id]
            self._by_key.pop(transport_session_key(transport_session.id), None)
            left = self._per_agent.get(transport_session.agent, 1) - 1
            if left > 0:
                self._per_agent[transport_session.agent] = left
            else:
                self._per_agent.pop(transport_session.agent, None)
        return calls

    def expired(self) -> list[TransportSession]:
        """Sessions idle past the timeout, removed from the registry (the caller closes them)."""
        now = self._clock()
        gone = [
            s for s in self._sessions.values() if now - s.last_seen > self._idle_timeout_s and not s.in_flight
        ]
        for transport_session in gone:
            self.remove(transport_session)
        return gone
