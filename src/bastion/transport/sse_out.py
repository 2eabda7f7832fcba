"""SSE framing of the streams Bastion itself writes to clients (DESIGN section 5, issue 8 point 7).

One place for the bytes of every client-facing event stream: POST answers that went to
SSE (``transport/channel.py``) and the session's GET stream (``transport/resume.py``).

Session era only, where events carry ids (2025-11-25 Streamable HTTP, "Resumability and
Redelivery", and SEP-1699): a stream opens with a *priming event*, an id and empty data,
plus a ``retry:`` hint, as the reference servers send with an event store. A client that
loses the stream before any message, or that the gateway lets go mid-call (mirroring an
upstream that closed its own stream to be polled), resumes from that id with a GET and
``Last-Event-ID``. An SSE client does not dispatch an event with empty data, so the
priming event is invisible to anything but the resumption machinery.

Every era: a stream with nothing to say carries a comment line (:data:`KEEPALIVE_FRAME`) now
and then, the GET stream every :data:`GET_KEEPALIVE_S`, a POST answer every
``gateway.sse_keepalive_s`` until its answer (``transport/channel.py``), so that neither an
intermediary nor a client's read timeout ends a stream that is only slow. A client's SSE parser
drops comments: they are never events, never numbered, never replayed.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_RETRY_MS",
    "GET_KEEPALIVE_S",
    "KEEPALIVE_FRAME",
    "MAX_RETRY_MS",
    "SSE_HEADERS",
    "primes",
    "priming_frame",
    "sse_frame",
]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
# An SSE comment line: bytes on the wire (they reset a client's per-read timeout), no event.
KEEPALIVE_FRAME = b": keepalive\n\n"
# How long a GET stream stays silent before a comment.
GET_KEEPALIVE_S = 15.0
# How long a client waits before reconnecting, unless the upstream of a call asked for its own;
# an upstream's hint is passed on within the bound Bastion keeps for itself (upstream/resume.py).
DEFAULT_RETRY_MS = 1000
MAX_RETRY_MS = 5000
# Priming events came with 2025-11-25 (SEP-1699); like the reference servers, Bastion primes only
# the streams of sessions that negotiated it or later (an older client may choke on empty data).
_PRIMING_SINCE = "2025-11-25"


def primes(protocol_version: str) -> bool:
    """Whether a session that negotiated ``protocol_version`` gets priming events (and polling)."""
    return protocol_version >= _PRIMING_SINCE


def sse_frame(payload: bytes, event_id: str | None = None) -> bytes:
    """One message event: ``payload`` (one JSON-RPC message) with its id, when the stream has ids."""
    head = b"" if event_id is None else b"id: " + event_id.encode() + b"\n"
    return head + b"event: message\ndata: " + payload + b"\n\n"


def priming_frame(event_id: str, retry_ms: int | None = None) -> bytes:
    """The event a stream opens with: an id to resume from, the reconnection delay, empty data."""
    retry = DEFAULT_RETRY_MS if retry_ms is None else min(max(int(retry_ms), 0), MAX_RETRY_MS)
    return b"id: " + event_id.encode() + b"\nretry: " + str(retry).encode() + b"\ndata: \n\n"
