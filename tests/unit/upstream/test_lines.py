"""Upstream lines are split without ever holding more than their bound (upstream/lines.py, #13 hardening)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bastion.errors import UpstreamResponseTooLarge
from bastion.testing.loopback import serve_on_loopback
from bastion.upstream.http_client import BodyOverLimit, UpstreamHttp
from bastion.upstream.lines import ANY_LINE_END, LineOverLimit, split_lines
from bastion.upstream.sse import iter_sse_events

pytestmark = pytest.mark.anyio

CHUNK = b"x" * 1000


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


class _Endless:
    """A source that never ends a line; counts the chunks taken from it."""

    def __init__(self, first: bytes = b"") -> None:
        self.first, self.taken = first, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.first:
            yield self.first
        while True:
            self.taken += 1
            yield CHUNK


async def _lines(*parts: bytes, max_line: int = 100) -> list[bytes]:
    return [line async for line in split_lines(_chunks(*parts), max_line=max_line, ends=ANY_LINE_END)]


async def test_an_endless_line_stops_the_reader_at_its_bound() -> None:
    """A line that never ends raises once past the bound, having read just one chunk beyond it."""
    source = _Endless()
    with anyio.fail_after(5), pytest.raises(LineOverLimit):
        async for _ in split_lines(source.__aiter__(), max_line=10_000):
            pass
    assert source.taken == 11


async def test_a_finished_line_over_the_bound_in_one_chunk_is_refused() -> None:
    """A whole line larger than the bound is refused even when it arrives in one chunk."""
    with pytest.raises(LineOverLimit):
        await _lines(b"a" * 101 + b"\n")
    assert await _lines(b"a" * 100 + b"\n") == [b"a" * 100]


async def test_line_ends_split_across_chunks_and_an_unfinished_tail() -> None:
    """CRLF split between chunks is one end; CR and LF end lines; a line with no end is dropped."""
    assert await _lines(b"one\r", b"\ntwo\rthree\n", b"fo", b"ur\r\n", b"tail") == [
        b"one",
        b"two",
        b"three",
        b"four",
    ]


async def test_an_sse_event_over_the_bound_is_too_large_however_its_lines_come() -> None:
    """Many small data lines or one endless one: past max_event_bytes the event is refused, typed."""
    many = b"data: " + b"y" * 600 + b"\n"
    with pytest.raises(UpstreamResponseTooLarge) as caught:
        async for _ in iter_sse_events(_chunks(many * 2, b"\n"), max_event_bytes=1024):
            pass
    assert caught.value.data["limit_bytes"] == 1024
    with anyio.fail_after(5), pytest.raises(UpstreamResponseTooLarge):
        async for _ in iter_sse_events(_Endless(b"data: ").__aiter__(), max_event_bytes=4096):
            pass
    fits = [
        e.data
        async for e in iter_sse_events(_chunks(b"data: " + b"z" * 1024 + b"\n\n"), max_event_bytes=1024)
    ]
    assert fits == ["z" * 1024]


async def test_a_declared_body_over_the_bound_is_refused_before_reading() -> None:
    """A JSON body whose Content-Length passes the bound is refused; one within it is read whole."""

    async def answer(request: Request) -> Response:
        return Response(b"{" + b" " * 2000 + b"}", media_type="application/json")

    app = Starlette(routes=[Route("/mcp", answer, methods=["POST"])])
    with anyio.fail_after(10):
        async with serve_on_loopback(app) as url, UpstreamHttp(read_timeout_s=5) as client:
            async with client.stream("POST", url, headers={}) as response:
                with pytest.raises(BodyOverLimit):
                    await response.aread(1024)
            async with client.stream("POST", url, headers={}) as response:
                assert len(await response.aread(4096)) == 2002
