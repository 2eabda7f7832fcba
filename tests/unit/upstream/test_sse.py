"""Upstream SSE decoding follows the HTML standard's event-stream rules (upstream/sse.py, issue 8 point 1)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bastion.errors import UpstreamProtocolError
from bastion.upstream.sse import SseCursor, SseEvent, iter_sse_events, iter_sse_messages

pytestmark = pytest.mark.anyio


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _events(*parts: bytes, cursor: SseCursor | None = None) -> list[SseEvent]:
    return [event async for event in iter_sse_events(_chunks(*parts), cursor)]


async def _messages(*parts: bytes) -> list[dict[str, object]]:
    return [message async for message in iter_sse_messages(_chunks(*parts))]


async def test_a_priming_event_is_not_dispatched_but_its_id_and_retry_count() -> None:
    """An id with an empty data line (a priming event) yields no message, yet sets the id and retry."""
    cursor = SseCursor()
    stream = b'id: s1:1\nretry: 750\ndata: \n\nid: s1:2\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'
    events = await _events(stream, cursor=cursor)
    assert [(e.data, e.last_event_id) for e in events] == [('{"jsonrpc":"2.0","id":1,"result":{}}', "s1:2")]
    assert cursor.retry_ms == 750 and cursor.last_event_id == "s1:2"


async def test_an_id_on_an_event_without_data_still_moves_the_cursor() -> None:
    """A dataless event's id is the stream's last event id (what a resumption sends)."""
    cursor = SseCursor()
    assert await _events(b"id: only-id\n\n", cursor=cursor) == []
    assert cursor.last_event_id == "only-id"


async def test_comments_are_ignored_and_data_lines_join_with_newlines() -> None:
    """Comment lines vanish; several data lines make one JSON text joined by LF."""
    messages = await _messages(
        b': keep-alive\ndata: {"jsonrpc":"2.0",\n: in between\ndata: "id":7,"result":{}}\n\n'
    )
    assert messages == [{"jsonrpc": "2.0", "id": 7, "result": {}}]


@pytest.mark.parametrize("newline", [b"\r\n", b"\r", b"\n"])
async def test_crlf_cr_and_lf_all_end_lines(newline: bytes) -> None:
    """Every line ending the standard allows ends a line."""
    stream = b"data: {}" + newline + newline + b"data: []" + newline + newline
    assert [e.data for e in await _events(stream)] == ["{}", "[]"]


async def test_a_crlf_split_across_chunks_is_one_line_end() -> None:
    """A CR at one chunk's end and LF at the next's start is one line end, not an empty line in between."""
    events = await _events(b"data: a\r", b"\ndata: b\r\n\r\n")
    assert [e.data for e in events] == ["a\nb"]


async def test_a_leading_bom_and_utf8_split_across_chunks_decode() -> None:
    """A byte order mark at the start is dropped; a multi-byte character split between chunks survives."""
    text = "data: é\n\n".encode()
    events = await _events(b"\xef\xbb\xbf" + text[:7], text[7:])
    assert [e.data for e in events] == ["é"]


async def test_field_rules_one_space_no_colon_unknown_fields_bad_retry_and_nul_ids() -> None:
    """One leading space goes; a bare name is an empty value; junk, bad retry and NUL ids are ignored."""
    cursor = SseCursor(retry_ms=100)
    stream = b"id: good\ndata:  two spaces\ndata\nfoo: bar\nretry: 12x\nid: bad\x00id\n\n"
    events = await _events(stream, cursor=cursor)
    assert [(e.data, e.last_event_id) for e in events] == [(" two spaces\n", "good")]
    assert cursor.retry_ms == 100


async def test_an_unfinished_event_at_the_end_of_the_stream_is_discarded() -> None:
    """Data not ended by an empty line is not an event."""
    assert await _events(b'data: {}\n\ndata: {"partial"') == [SseEvent("message", "{}", "")]


async def test_events_of_other_types_are_not_mcp_messages() -> None:
    """An event with a type other than ``message`` is skipped, whatever its data."""
    assert await _messages(b"event: ping\ndata: not json\n\nevent: message\ndata: {}\n\n") == [{}]


@pytest.mark.parametrize("data", [b"not json", b"[1, 2]"])
async def test_a_message_that_is_not_a_json_object_is_a_protocol_error(data: bytes) -> None:
    """A ``message`` event whose data is not a JSON object raises ``UpstreamProtocolError``."""
    with pytest.raises(UpstreamProtocolError):
        await _messages(b"data: " + data + b"\n\n")
