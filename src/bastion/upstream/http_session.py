"""One upstream session of a Streamable HTTP upstream (session era), as Bastion holds it.

Owns the record only: who it belongs to (its channel), what was negotiated, what is in flight
on it and its GET stream's scope. Never persisted (DESIGN section 1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import anyio

from bastion.upstream.base import SessionChannel
from bastion.upstream.relay import RequestRelay

__all__ = ["HttpUpstreamSession", "SessionGone"]


class SessionGone(Exception):
    """The upstream answered 404 to an upstream session id: re-initialize."""


@dataclass(eq=False)
class HttpUpstreamSession:
    """One upstream session (session era), opened for one client session."""

    session_id: str | None
    protocol_version: str
    capabilities: dict[str, Any]
    server_capabilities: dict[str, Any] = dataclasses.field(default_factory=dict)
    log_level: str | None = None  # the level last sent with logging/setLevel
    # Its GET stream, followed from its opening (issue 22) or once its client subscribed (issue 9).
    watch: anyio.CancelScope | None = None
    # The owner's way back outside a request (None: the catalog session, or an ephemeral one).
    channel: SessionChannel | None = None
    # The relays of the requests in flight on it: a request its GET stream brings goes to one.
    relays: list[RequestRelay] = dataclasses.field(default_factory=list)
    # Its own tools/list (issue 22), with the upstream's catalog generation it was listed in.
    tools: list[dict[str, Any]] | None = None
    tools_generation: int = -1
    is_catalog: bool = False  # the gateway's own listing session, owned by no client
