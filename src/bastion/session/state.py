"""Per transport session state, and nowhere else (DESIGN section 5).

One :class:`TransportSession` record holds everything that belongs to one
client's session-era transport session: negotiated version, declared
capabilities and client info, its in-flight request table (keyed by the
client's own JSON-RPC ids), the requests relayed to it and awaiting its
answer (keyed by gateway-minted ids), the upstream sessions opened for it,
and its server-to-client GET stream with the event buffer used for
``Last-Event-ID`` resumption. Nothing here is shared between two records.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.ids import AgentId, TransportSessionId
from bastion.upstream.base import UpstreamSessions

__all__ = ["InFlightCall", "PendingClientRequest", "ServerStream", "TransportSession"]

RequestId = str | int


@dataclass(eq=False)
class InFlightCall:
    """One client request being served; cancelling its scope ends only this request."""

    client_request_id: RequestId
    method: str
    cancel_scope: anyio.CancelScope
    # Set when the request has finished (its outcome recorded), so closing the session can wait for it.
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(eq=False)
class PendingClientRequest:
    """A server-to-client request relayed to this client, waiting for the client's answer."""

    done: anyio.Event = field(default_factory=anyio.Event)
    reply: dict[str, Any] | None = None


class ServerStream:
    """The GET stream of one session: numbered events, a bounded replay buffer, one reader at a time.

    A new GET replaces the previous reader (a client reconnecting after a drop
    must not be locked out by its own half-dead stream).
    """

    def __init__(self, capacity: int = 256) -> None:
        # Event ids are "<nonce>-<n>": a Last-Event-ID from another stream names nothing here.
        self.nonce = secrets.token_hex(6)
        self._events: deque[tuple[int, bytes]] = deque(maxlen=capacity)
        self._last = 0
        self._seq = itertools.count(1)
        self._changed = anyio.Event()
        self._reader = 0

    def attach(self) -> int:
        """Make a new reader the only one; an older reader sees :meth:`is_current` turn false."""
        self._reader += 1
        self._wake()
        return self._reader

    def is_current(self, reader: int) -> bool:
        return reader == self._reader

    def publish(self, payload: bytes) -> int:
        event_id = next(self._seq)
        self._last = event_id
        self._events.append((event_id, payload))
        self._wake()
        return event_id

    def _wake(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def last_id(self) -> int:
        return self._last

    def after(self, last_event_id: int) -> list[tuple[int, bytes]]:
        return [(eid, data) for eid, data in self._events if eid > last_event_id]

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def close(self) -> None:
        self._reader += 1
        self._wake()


@dataclass(eq=False)
class TransportSession:
    """One client's session-era transport session."""

    id: TransportSessionId
    agent: AgentId
    principal: Principal
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any]
    created_at: float
    last_seen: float
    evidence: EvidenceScope
    upstream_sessions: UpstreamSessions = field(default_factory=UpstreamSessions)
    in_flight: dict[RequestId, InFlightCall] = field(default_factory=dict)
    client_requests: dict[str, PendingClientRequest] = field(default_factory=dict)
    server_stream: ServerStream = field(default_factory=ServerStream)
    log_level: str | None = None
    terminated: bool = False
    # Namespaces whose tools this session's last tools/list showed (attachment evidence).
    surface_namespaces: frozenset[str] | None = None
    _relay_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # Several replicas may serve this session at once (#10): their relay ids must never meet.
    _relay_prefix: str = field(default_factory=lambda: secrets.token_hex(4))

    def next_relay_id(self) -> str:
        """A fresh id for a request the gateway sends to this client, unique across replicas."""
        return f"bastion-r{self._relay_prefix}-{next(self._relay_ids)}"

    def cancel_all(self) -> None:
        for call in self.in_flight.values():
            call.cancel_scope.cancel()
        for pending in self.client_requests.values():
            pending.done.set()
        self.server_stream.close()
