"""Per transport session state, and nowhere else (DESIGN section 5).

One :class:`TransportSession` record holds everything that belongs to one
client's session-era transport session: negotiated version, declared
capabilities and client info, its in-flight request table (keyed by the
client's own JSON-RPC ids), the requests relayed to it and awaiting its
answer (keyed by gateway-minted ids), the upstream sessions opened for it,
and its SSE streams (GET and POST responses) with the event buffers used
for ``Last-Event-ID`` resumption (``session/replay.py``). Nothing here is shared between two records.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.ids import AgentId, TransportSessionId
from bastion.session.replay import EventStream, SessionStreams
from bastion.upstream.base import UpstreamSessions

__all__ = ["InFlightCall", "PendingClientRequest", "TransportSession"]

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
    streams: SessionStreams = field(default_factory=SessionStreams)
    log_level: str | None = None
    terminated: bool = False
    # Namespaces whose tools this session's last tools/list showed (attachment evidence).
    surface_namespaces: frozenset[str] | None = None
    # Task statuses an upstream pushed, by (server, upstream task id), before the task they name was
    # recorded (tasks/relay.py): held while a call is in flight, at most a few; None until one is.
    early_task_statuses: dict[tuple[str, str], dict[str, Any]] | None = None
    _relay_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # Several replicas may serve this session at once (#10): their relay ids must never meet.
    _relay_prefix: str = field(default_factory=lambda: secrets.token_hex(4))

    @property
    def server_stream(self) -> EventStream:
        """The GET stream: notifications not tied to one request (``tools/list_changed``)."""
        return self.streams.server

    def next_relay_id(self) -> str:
        """A fresh id for a request the gateway sends to this client, unique across replicas."""
        return f"bastion-r{self._relay_prefix}-{next(self._relay_ids)}"

    def cancel_all(self) -> None:
        for call in self.in_flight.values():
            call.cancel_scope.cancel()
        for pending in self.client_requests.values():
            pending.done.set()
        self.streams.close()
