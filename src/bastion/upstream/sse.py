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
``UpstreamProtocolError``. The ids and the retry hint are kept in a :class:`SseCursor`, which
is what resuming a dropped stream with ``Last-Event-ID`` needs. Never does I/O itself.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bastion.errors import UpstreamProtocolError

__all__ = ["SseCursor", "SseEvent", "iter_sse_events", "iter_sse_messages"]

_BOM = "\ufeff"


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


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """(1) Decoded lines ending at CRLF, LF or CR; a CR at a chunk's end waits for the next chunk's LF."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buffer = ""
    first = True
    async for chunk in chunks:
        buffer += decoder.decode(chunk)
        if first and buffer:
            buffer = buffer.removeprefix(_BOM)
            first = False
        start = 0
        while True:
            cr, lf = buffer.find("\r", start), buffer.find("\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr + 1 == len(buffer):
                    break  # maybe CRLF split across chunks: decide with the next chunk
                yield buffer[start:cr]
                start = cr + 2 if buffer[cr + 1] == "\n" else cr + 1
            else:
                yield buffer[start:lf]
                start = lf + 1
        buffer = buffer[start:]
    buffer += decoder.decode(b"", final=True)
    if buffer.endswith("\r"):
        yield buffer[:-1]
    # (6) Anything after the last line end is an unfinished line: discarded.


async def iter_sse_events(
    chunks: AsyncIterator[bytes], cursor: SseCursor | None = None
) -> AsyncIterator[SseEvent]:
    """Every dispatched event of the stream, updating ``cursor`` (ids, retry) as lines arrive."""
    cursor = cursor if cursor is not None else SseCursor()
    data: list[str] = []
    event_type = ""
    id_buffer = cursor.last_event_id
    async for line in _lines(chunks):
        if line == "":
            # (4, 5) The id counts at dispatch even when no event is dispatched.
            cursor.last_event_id = id_buffer
            joined = "\n".join(data)
            if joined:
                cursor.events += 1
                yield SseEvent(event_type or "message", joined, cursor.last_event_id)
            data, event_type = [], ""
            continue
        if line.startswith(":"):
            continue  # (2) a comment
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]  # (3)
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
        elif name == "id":
            if "\0" not in value:
                id_buffer = value
        elif name == "retry" and value and value.isascii() and value.isdigit():
            cursor.retry_ms = int(value)
    # (6) An event not ended by an empty line is discarded.


async def iter_sse_messages(
    chunks: AsyncIterator[bytes], cursor: SseCursor | None = None
) -> AsyncGenerator[dict[str, Any], None]:
    """The JSON-RPC messages of the stream's ``message`` events.

    Raises:
        UpstreamProtocolError: a ``message`` event whose data is not a JSON object.
    """
    async for event in iter_sse_events(chunks, cursor):
        if event.event != "message":
            continue
        try:
            message = json.loads(event.data)
        except ValueError as exc:
            raise UpstreamProtocolError("upstream sent an SSE event that is not JSON") from exc
        if not isinstance(message, dict):
            raise UpstreamProtocolError("upstream sent an SSE event that is not a JSON object")
        yield message
