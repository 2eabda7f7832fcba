"""Server-Sent Events from upstreams, decoded as the HTML standard's event-stream rules say (issue 8 point 1).

Owns: turning an upstream's ``text/event-stream`` bytes into events (WHATWG HTML,
"Interpreting an event stream"), then into JSON-RPC message dicts. Followed to the letter:

1. a leading UTF-8 BOM is dropped; lines end at CRLF, LF or CR, even split across chunks;
2. an empty line dispatches the event; a line starting with ``:`` is a comment;
3. ``field:value`` loses one leading space from the value; a line without a colon is a field
   with an empty value; unknown fields are ignored;
4. ``data`` lines join with ``\\n``; ``id`` sets the last event id (unless it holds NUL), even
   for an event with no data; ``retry`` counts only when it is all ASCII digits;
5. an event whose data is empty is not dispatched (a priming event, a keep-alive): its id
   still counts, so a stream can be resumed from it;
6. what is pending when the stream ends is discarded (an event is only what an empty line ends).

MCP sends JSON-RPC in events of the default type ``message``; events of any other type are
not MCP's and are skipped. A ``message`` whose data is not a JSON object raises
``UpstreamProtocolError``; one whose data (or any one line) passes ``max_event_bytes`` raises
``UpstreamResponseTooLarge`` as soon as the bound is crossed, never holding more than that
(the server's ``max_response_bytes``). The ids and the retry hint are kept in a
:class:`SseCursor`, which is what resuming a dropped stream with ``Last-Event-ID`` needs.
Never does I/O itself.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bastion.errors import UpstreamProtocolError, UpstreamResponseTooLarge
from bastion.policy.snapshot import DEFAULT_MAX_RESPONSE_BYTES
from bastion.upstream.lines import ANY_LINE_END, LineOverLimit, LineSplitter
from bastion.wire_value import loads_exact

__all__ = ["SseCursor", "SseEvent", "iter_sse_events", "iter_sse_messages"]

_BOM = b"\xef\xbb\xbf"
_COLON = 0x3A
# A line holds its field name besides the event's data.
_FIELD_ROOM = 64


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: its type (``message`` by default), data, and the last event id in force."""

    event: str
    data: str
    last_event_id: str


@dataclass
class SseCursor:
    """Where a stream stands: the last event id seen (priming events included) and the retry hint."""

    last_event_id: str = ""
    retry_ms: int | None = None
    events: int = field(default=0)


async def iter_sse_events(
    chunks: AsyncIterator[bytes],
    cursor: SseCursor | None = None,
    *,
    max_event_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> AsyncIterator[SseEvent]:
    """Every dispatched event of the stream, updating ``cursor`` (ids, retry) as lines arrive.

    Raises:
        UpstreamResponseTooLarge: an event's data (or one line) passed ``max_event_bytes``.
    """
    cursor = cursor if cursor is not None else SseCursor()
    data: list[bytes] = []
    size = 0
    event_type = ""
    id_buffer = cursor.last_event_id
    first = True
    splitter = LineSplitter(max_event_bytes + _FIELD_ROOM, ANY_LINE_END)
    async for chunk in chunks:
        try:
            lines = splitter.feed(chunk)
        except LineOverLimit as exc:
            raise UpstreamResponseTooLarge(
                f"upstream sent an SSE line over {exc.limit} bytes", limit_bytes=exc.limit
            ) from exc
        if first and lines:
            lines[0], first = lines[0].removeprefix(_BOM), False  # (1)
        for line in lines:
            if not line:
                # (4, 5) The id counts at dispatch even when no event is dispatched.
                cursor.last_event_id = id_buffer
                joined = b"\n".join(data)
                if joined:
                    cursor.events += 1
                    yield SseEvent(event_type or "message", _text(joined), cursor.last_event_id)
                data, size, event_type = [], 0, ""
                continue
            if line[0] == _COLON:
                continue  # (2) a comment
            name, colon, value = line.partition(b":")
            if colon and value[:1] == b" ":
                value = value[1:]  # (3)
            if name == b"data":
                data.append(value)
                size += len(value) + 1
                if size > max_event_bytes + 1:
                    raise UpstreamResponseTooLarge(
                        f"upstream sent an SSE event over {max_event_bytes} bytes",
                        limit_bytes=max_event_bytes,
                    )
            elif name == b"event":
                event_type = _text(value)
            elif name == b"id":
                if b"\0" not in value:
                    id_buffer = _text(value)
            elif name == b"retry" and value and value.isdigit():
                cursor.retry_ms = int(value)  # bytes.isdigit: ASCII digits only
    # (6) An event not ended by an empty line is discarded.


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


async def iter_sse_messages(
    chunks: AsyncIterator[bytes],
    cursor: SseCursor | None = None,
    *,
    max_event_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> AsyncGenerator[dict[str, Any], None]:
    """The JSON-RPC messages of the stream's ``message`` events.

    Raises:
        UpstreamProtocolError: a ``message`` event whose data is not a JSON object.
        UpstreamResponseTooLarge: an event's data passed ``max_event_bytes`` (read no further).
    """
    async for event in iter_sse_events(chunks, cursor, max_event_bytes=max_event_bytes):
        if event.event != "message":
            continue
        try:
            message = loads_exact(event.data)
        except ValueError as exc:
            raise UpstreamProtocolError("upstream sent an SSE event that is not JSON") from exc
        if not isinstance(message, dict):
            raise UpstreamProtocolError("upstream sent an SSE event that is not a JSON object")
        yield message
