"""Distinct identifier types (DESIGN section 1).

Each identifier names a different thing with a different owner and lifetime.
They are ``NewType``s so that mypy refuses to pass one where another belongs:
a transport session id is never an evidence session id, and neither is an
agent. This module owns the types and the minting of gateway-made ids; it
never parses caller-supplied values (see ``admission/`` for execution ids).
"""

from __future__ import annotations

import secrets
from typing import NewType

__all__ = [
    "AgentId",
    "CallId",
    "Epoch",
    "EvidenceSessionId",
    "ExecutionId",
    "TransportSessionId",
    "WorkerId",
    "WorkflowId",
    "new_call_id",
    "new_evidence_session_id",
    "new_transport_session_id",
]

AgentId = NewType("AgentId", str)
TransportSessionId = NewType("TransportSessionId", str)
EvidenceSessionId = NewType("EvidenceSessionId", str)
CallId = NewType("CallId", str)
ExecutionId = NewType("ExecutionId", str)
WorkflowId = NewType("WorkflowId", str)
WorkerId = NewType("WorkerId", str)
Epoch = NewType("Epoch", int)


def new_transport_session_id() -> TransportSessionId:
    """A fresh ``Mcp-Session-Id``: 192 random bits, URL-safe, visible ASCII only."""
    return TransportSessionId(secrets.token_urlsafe(24))


def new_evidence_session_id() -> EvidenceSessionId:
    """A fresh evidence session id (one audit chain)."""
    return EvidenceSessionId("ev_" + secrets.token_hex(16))


def new_call_id() -> CallId:
    """A fresh id for one attempt of one tool call."""
    return CallId("call_" + secrets.token_hex(12))
