"""Upstream lines are split without ever holding more than their bound (upstream/lines.py, #13 hardening)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bastion.errors import UpstreamResponseTooLarge
from bastion.upstream.http_client import BodyOverLimit, UpstreamHttp
from bastion.upstream.lines import ANY_LINE_END, LF, LineOverLimit, LineSplitter
from bastion.upstream.sse import iter_sse_events
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

CHUNK = b"x" * 1000


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _endless(first: bytes) -> AsyncIterator[bytes]:
    """A source that never ends a line."""
    yield first
    while True:
        yield CHUNK


def _lines(*parts: bytes, max_line: int = 100) -> list[bytes]:
    splitter = LineSplitter(max_line, ANY_LINE_END)
    return [line for part in parts for line in splitter.feed(part)]


def test_an_endless_line_stops_the_reader_at_its_bound() -> None:
    """A line that never ends is refused once past the bound, one chunk beyond it, holding no more."""
    splitter = LineSplitter(10_000, LF)
    taken = 0
    with pytest.raises(LineOverLimit):
        while taken < 1000:
            taken += 1
            assert splitter.feed(CHUNK) == []
    assert taken == 11


def test_a_finished_line_over_the_bound_in_one_chunk_is_refused() -> None:
    """A whole line larger than the bound is refused even when it arrives in one chunk."""
    with pytest.raises(LineOverLimit):
        _lines(b"ok\n" + b"a" * 101 + b"\n")
    with pytest.raises(LineOverLimit):
        _lines(b"a" * 60, b"a" * 41 + b"\n")
    assert _lines(b"a" * 60, b"a" * 40 + b"\n") == [b"a" * 100]


def test_line_ends_split_across_chunks_and_an_unfinished_tail() -> None:
    """CRLF split between chunks is one end; CR and LF end lines; a line with no end is not given."""
    assert _lines(b"one\r", b"\ntwo\rthree\n", b"fo", b"ur\r\n", b"\n", b"tail") == [
        b"one",
        b"two",
        b"three",
        b"four",
        b"",
    ]


async def test_an_sse_event_over_the_bound_is_too_large_however_its_lines_come() -> None:
    """Many small data lines or one endless one: past max_event_bytes the event is refused, typed."""
    many = b"data: " + b"y" * 600 + b"\n"
    with pytest.raises(UpstreamResponseTooLarge) as caught:
        async for _ in iter_sse_events(_chunks(many * 2, b"\n"), max_event_bytes=1024):
            pass
    assert caught.value.data["limit_bytes"] == 1024
    with anyio.fail_after(5), pytest.raises(UpstreamResponseTooLarge):
        async for _ in iter_sse_events(_endless(b"data: "), max_event_bytes=4096):
            pass
    fits = [
        e.data
        async for e in iter_sse_events(_chunks(b"data: " + b"z" * 1024 + b"\n\n"), max_event_bytes=1024)
    ]
    assert fits == ["z" * 1024]


async def test_a_declared_body_over_the_bound_is_refused_before_reading() -> None:
    """A JSON body whose Content-Length passes the bound is refused; so is a small compressed body
    that decodes past it (a bomb); one within the bound is read whole."""
    bomb = gzip.compress(b"{" + b" " * 200_000 + b"}")

    async def answer(request: Request) -> Response:
        if request.query_params.get("bomb"):
            return Response(bomb, media_type="application/json", headers={"content-encoding": "gzip"})
        return Response(b"{" + b" " * 2000 + b"}", media_type="application/json")

    app = Starlette(routes=[Route("/mcp", answer, methods=["POST"])])
    with anyio.fail_after(10):
        async with serve_on_loopback(app) as url, UpstreamHttp(read_timeout_s=5) as client:
            async with client.stream("POST", url, headers={}) as response:
                with pytest.raises(BodyOverLimit):
                    await response.aread(1024)
            async with client.stream("POST", url + "?bomb=1", headers={}) as response:
                assert int(response.headers["content-length"]) < 4096
                with pytest.raises(BodyOverLimit):
                    await response.aread(4096)
            async with client.stream("POST", url, headers={}) as response:
                assert len(await response.aread(4096)) == 2002
