"""The session-era GET: a session's own event stream, resumed by ``Last-Event-ID`` (DESIGN section 5).

2025-11-25 transports, "Listening for Messages" and "Resumability": a GET
without ``Last-Event-ID`` opens the session's server stream from now on; a GET
with one replays exactly the events after it on the stream it came from (the
GET stream, or a POST response stream the client lost) and continues that
stream live. Every GET of a 2025-11-25 session opens with a priming event
(``transport/sse_out.py``) naming where it starts. A response stream ends once
its response went out. The id is looked up only among this session's streams (``session/replay.py``), so
another session's id, an unknown one or one whose successors are gone is
refused (``LastEventIdUnknown``, 400) before anything is sent.
"""

from __future__ import annotations

import anyio
from starlette.types import Receive, Send

from bastion.errors import LastEventIdUnknown
from bastion.session.replay import EventStream
from bastion.session.state import TransportSession
from bastion.transport.sse_out import (
    GET_KEEPALIVE_S,
    KEEPALIVE_FRAME,
    SSE_HEADERS,
    primes,
    priming_frame,
    sse_frame,
)
from bastion.transport.wire import watch_disconnect

__all__ = ["serve_event_stream"]


async def serve_event_stream(
    receive: Receive, send: Send, transport_session: TransportSession, last_event_id: str | None
) -> None:
    """Write one of the session's streams to this GET until it ends, is taken over, or the client goes.

    Raises:
        LastEventIdUnknown: ``last_event_id`` names nothing this session can replay exactly.
    """
    stream: EventStream
    if last_event_id:
        stream, cursor = transport_session.streams.resume(last_event_id)
    else:
        stream = transport_session.streams.server
        cursor = stream.last_number()
    reader = stream.attach()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*SSE_HEADERS, (b"mcp-session-id", transport_session.id.encode())],
        }
    )
    try:
        if primes(transport_session.protocol_version):
            # Where this reader stands, so a drop before the next event still resumes exactly.
            priming = priming_frame(stream.event_id(cursor))
            await send({"type": "http.response.body", "body": priming, "more_body": True})
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_disconnect, receive, tg.cancel_scope)
            while not transport_session.terminated and stream.is_current(reader):
                changed = stream.changed
                try:
                    pending = stream.after(cursor)
                except LastEventIdUnknown:
                    break  # this reader fell behind the buffer: end, the client's resume is refused
                for number, payload in pending:
                    frame = sse_frame(payload, stream.event_id(number))
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                    cursor = number
                if stream.finished and cursor == stream.last_number():
                    break  # a response stream whose response went out
                with anyio.move_on_after(GET_KEEPALIVE_S) as keepalive:
                    await changed.wait()
                if keepalive.cancelled_caught:
                    await send({"type": "http.response.body", "body": KEEPALIVE_FRAME, "more_body": True})
            tg.cancel_scope.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass
