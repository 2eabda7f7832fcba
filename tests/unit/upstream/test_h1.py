"""The upstream side's HTTP/1.1 client (upstream/h1.py behind upstream/http_client.py), on raw sockets.

Each test serves hand-written HTTP bytes from a loopback asyncio server, so what the
client must survive (a body ended by EOF, a chunked body in pieces, a broken or
malformed response, bytes nobody asked for, a silent upstream) is exactly on the wire.
Every test runs on asyncio's own loop and on uvloop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest

from bastion.upstream.http_client import (
    BodyOverLimit,
    ConnectError,
    HttpTimeout,
    StreamBroken,
    UpstreamHttp,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Both loops ``bastion serve`` may run on: uvloop calls ``connection_made`` later than asyncio."""
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Server:
    """A loopback server running ``handler`` per connection; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/mcp"


@contextlib.asynccontextmanager
async def _serving(handler: Handler) -> AsyncIterator[_Server]:
    served = _Server(handler)
    served.server = await asyncio.start_server(served._serve, "127.0.0.1", 0)
    try:
        yield served
    finally:
        served.server.close()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


def _keep_alive(body: bytes, *, extra: bytes = b"") -> Handler:
    """Answers every request on the connection with ``body`` (Content-Length), kept alive."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + extra
                + b"content-length: %d\r\n\r\n" % len(body)
                + body
            )
            await writer.drain()

    return handler


async def test_a_header_that_could_split_the_request_is_refused_before_anything_is_sent() -> None:
    """A CR or LF in a header value, or a name that is no HTTP token, raises ValueError; no byte goes out."""
    async with _serving(_keep_alive(b"{}")) as server:
        async with UpstreamHttp(read_timeout_s=5) as client:
            for headers in (
                {"x-evil": "a\r\nx-injected: 1"},
                {"x-evil": "a\nb"},
                {"bad name": "v"},
                {"x:y": "v"},
            ):
                with pytest.raises(ValueError, match="not a valid HTTP field"):
                    async with client.stream("POST", server.url, headers=headers, content=b"{}"):
                        pass
        assert server.connections == 0


async def test_kept_alive_connection_is_reused_and_framing_headers_are_ours() -> None:
    """Sequential exchanges share one connection; a caller's host or content-length never reaches the wire."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await _read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    async with _serving(handler) as server:
        with anyio.fail_after(10):
            async with UpstreamHttp(read_timeout_s=5) as client:
                for n in range(5):
                    async with client.stream(
                        "POST",
                        server.url + "?q=1",
                        headers={"Host": "evil.example", "content-length": "999", "x-n": str(n)},
                        content=b"hello",
                    ) as response:
                        assert response.status_code == 200
                        assert await response.aread(100) == b"ok"
        assert server.connections == 1
        assert len(seen) == 5
        first = seen[0].decode()
        assert first.startswith("POST /mcp?q=1 HTTP/1.1\r\n")
        assert "evil.example" not in first and "999" not in first
        assert f"host: 127.0.0.1:{server.url.split(':')[2].split('/')[0]}\r\n" in first
        assert first.endswith("content-length: 5\r\n\r\nhello")


async def test_a_chunked_body_and_a_body_ended_by_eof_are_read_whole() -> None:
    """A chunked body sent in small pieces and an HTTP/1.0-style body ended by the close both read in full."""
    big = bytes(range(256)) * 4096  # 1 MiB: read through back-pressure

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await _read_request(reader)
            if b"/eof" in request.split(b"\r\n", 1)[0]:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n" + big)
                await writer.drain()
                return  # the close ends the body
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for start in range(0, len(big), 100_000):
                piece = big[start : start + 100_000]
                writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with _serving(handler) as server:
        with anyio.fail_after(20):
            async with UpstreamHttp(read_timeout_s=5) as client:
                async with client.stream("GET", server.url, headers={}) as response:
                    assert await response.aread(2 * len(big)) == big
                async with client.stream("GET", server.url[:-4] + "/eof", headers={}) as response:
                    assert await response.aread(2 * len(big)) == big
                async with client.stream("GET", server.url[:-4] + "/eof", headers={}) as response:
                    with pytest.raises(BodyOverLimit):
                        await response.aread(1000)


async def test_a_break_mid_body_and_a_malformed_response_are_stream_broken() -> None:
    """A body cut short by the close, or a status line that is not HTTP, raises StreamBroken."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        if b"/garbage" in request.split(b"\r\n", 1)[0]:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly-this")
        await writer.drain()

    async with _serving(handler) as server:
        with anyio.fail_after(10):
            async with UpstreamHttp(read_timeout_s=5) as client:
                async with client.stream("POST", server.url, headers={}, content=b"{}") as response:
                    with pytest.raises(StreamBroken):
                        await response.aread(1000)
                with pytest.raises(StreamBroken, match="malformed"):
                    async with client.stream("POST", server.url[:-4] + "/garbage", headers={}, content=b"{}"):
                        pass


async def test_a_silent_upstream_times_out_per_read_and_none_waits_on() -> None:
    """No byte within the read bound raises HttpTimeout; with no bound the read waits until cancelled."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(30)

    async with _serving(handler) as server:
        with anyio.fail_after(10):
            async with UpstreamHttp(read_timeout_s=0.3) as client:
                async with client.stream("GET", server.url, headers={}) as response:
                    with pytest.raises(HttpTimeout):
                        await response.aread(1000)
                with anyio.move_on_after(0.6) as waited:
                    async with client.stream("GET", server.url, headers={}, read_timeout_s=None) as response:
                        await response.aread(1000)
                assert waited.cancel_called


async def test_the_pool_bound_makes_a_request_wait_then_refuses_past_the_connect_bound() -> None:
    """With one connection allowed and held, another request waits for it; never freed, ConnectError."""
    async with _serving(_keep_alive(b"{}")) as server:
        with anyio.fail_after(10):
            async with UpstreamHttp(read_timeout_s=5, connect_timeout_s=0.3, max_connections=1) as client:
                async with client.stream("POST", server.url, headers={}, content=b"{}") as held:
                    with pytest.raises(ConnectError, match="connect bound"):
                        async with client.stream("POST", server.url, headers={}, content=b"{}"):
                            pass
                    assert await held.aread(10) == b"{}"
                got = anyio.Event()

                async def second() -> None:
                    async with client.stream("POST", server.url, headers={}, content=b"{}") as response:
                        assert await response.aread(10) == b"{}"
                    got.set()

                async with (
                    client.stream("POST", server.url, headers={}, content=b"{}") as first,
                    anyio.create_task_group() as tg,
                ):
                    tg.start_soon(second)
                    await anyio.sleep(0.05)
                    assert not got.is_set()
                    await first.aread(10)
                    first.close()  # the slot goes back: the waiting request proceeds
                    await got.wait()
        assert server.connections == 1


async def test_an_abandoned_response_or_unasked_bytes_close_the_connection() -> None:
    """A response left unread closes its connection; so do bytes sent after the answer; neither is reused."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA")
            await writer.drain()

    async with _serving(handler) as server:
        with anyio.fail_after(10):
            async with UpstreamHttp(read_timeout_s=5) as client:
                async with client.stream("POST", server.url, headers={}, content=b"{}"):
                    pass  # headers only: abandoned
                for _ in range(2):
                    async with client.stream("POST", server.url, headers={}, content=b"{}") as response:
                        assert await response.aread(10) == b"ok"
                    await anyio.sleep(0.05)  # the stray bytes arrive
        assert server.connections == 3


async def test_a_compressed_body_sent_unasked_is_decoded_and_an_unknown_coding_refused() -> None:
    """identity is asked for; a gzip body is decoded anyway; a coding Bastion cannot read is StreamBroken."""
    packed = gzip.compress(b'{"a":1}')
    asked: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await _read_request(reader)
            asked.append(request)
            coding = b"br" if b"/br" in request.split(b"\r\n", 1)[0] else b"gzip"
            head = b"HTTP/1.1 200 OK\r\ncontent-encoding: %s\r\ncontent-length: %d\r\n\r\n"
            writer.write(head % (coding, len(packed)) + packed)
            await writer.drain()

    async with _serving(handler) as server:
        with anyio.fail_after(10):
            async with UpstreamHttp(read_timeout_s=5) as client:
                async with client.stream("POST", server.url, headers={}, content=b"{}") as response:
                    assert await response.aread(100) == b'{"a":1}'
                async with client.stream(
                    "POST", server.url[:-4] + "/br", headers={}, content=b"{}"
                ) as response:
                    with pytest.raises(StreamBroken, match="content-encoding"):
                        await response.aread(100)
        assert b"accept-encoding: identity\r\n" in asked[0].lower()
