"""Distinct identifier types (DESIGN section 1).

Each identifier names a different thing with a different owner and lifetime.
They are ``NewType``s so that mypy refuses to pass one where another belongs:
a transport session id is never an evidence session id, and neither is an
agent. This module owns the types and the minting of gateway-made ids; it
never parses caller-supplied values (see ``admission/`` for execution ids).
"""

from __future__ import annotations

import os
import secrets
import threading
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
    """A fresh id for one attempt of one tool call: 96 bits from the system's CSPRNG."""
    return CallId("call_" + _CALL_ID_BYTES.take(12).hex())


class _UrandomBlocks:
    """``os.urandom`` read a block at a time, each byte handed out once.

    The bytes are the system CSPRNG's, as ``secrets`` would give; reading them 4 KiB at a
    time spares the hot path a system call per id, and with it a release of the GIL that
    lets the store's writer thread in between a call's steps. A forked child starts a fresh
    block, so parent and child never hand out the same bytes.
    """

    def __init__(self, block: int = 4096) -> None:
        self._block = block
        self._lock = threading.Lock()
        self._buffer = b""
        self._offset = 0
        os.register_at_fork(after_in_child=self._forget)

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._offset + n > len(self._buffer):
                self._buffer = os.urandom(max(self._block, n))
                self._offset = 0
            start = self._offset
            self._offset = start + n
            return self._buffer[start : start + n]

    def _forget(self) -> None:
        self._buffer = b""
        self._offset = 0
        self._lock = threading.Lock()


_CALL_ID_BYTES = _UrandomBlocks()
