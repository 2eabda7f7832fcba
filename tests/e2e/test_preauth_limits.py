"""Pre-authentication bounds on the front door (issue #12 point 2): header size and count, header and
body deadlines, unauthenticated connections per client address (issue #22). Raw sockets against a
real loopback server."""

from __future__ import annotations

import re
import resource
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from anyio.abc import SocketStream

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.transport.limits import front_door_limits
from tests.e2e.conftest import TOKENS, Upstream, gateway_config
from tests.e2e.test_serve_process import DEAD_URL, Serve
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

PER_ADDRESS = 4


@pytest.fixture
async def limited_url(tmp_path: Path, tools_upstream: Upstream) -> AsyncIterator[str]:
    config = gateway_config(
        tmp_path,
        tools_upstream.url,
        max_header_bytes=4096,
        max_headers=20,
        header_timeout_s=0.5,
        body_timeout_s=0.5,
        max_unauthenticated_connections_per_address=PER_ADDRESS,
    )
    snapshot = snapshot_from_mapping(config, source=None, version="test")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app, limits=front_door_limits(snapshot.gateway)) as url:
        yield url


async def _connect(url: str) -> SocketStream:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return await anyio.connect_tcp(parts.hostname, parts.port)


async def _read_all(stream: SocketStream) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    received = b""
    with anyio.fail_after(10):
        while True:
            try:
                received += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                return received


async def _healthz(url: str) -> int:
    """GET /healthz, retried while the server is still counting closed connections."""
    with anyio.fail_after(10):
        while True:
            try:
                async with httpx.AsyncClient(timeout=5) as http:
                    return (await http.get(url.replace("/mcp", "/healthz"))).status_code
            except httpx.TransportError:
                await anyio.sleep(0.05)


async def test_huge_header_is_refused_with_431_without_buffering(limited_url: str) -> None:
    """A 16 MiB header is answered 431 (or cut) after a few KiB, and the server does not hold it."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stream = await _connect(limited_url)
    await stream.send(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    chunk = b"a" * 65_536
    sent = 0
    with anyio.fail_after(30):
        try:
            while sent < 16 * 1024 * 1024:
                await stream.send(chunk)
                sent += len(chunk)
        except (anyio.BrokenResourceError, ConnectionResetError, BrokenPipeError):
            pass
    answer = await _read_all(stream)
    await stream.aclose()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 ")
    assert sent < 16 * 1024 * 1024 or answer.startswith(b"HTTP/1.1 431 ")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < 8 * 1024, f"peak memory grew {grown_kib} KiB"
    assert await _healthz(limited_url) == 200


async def test_too_many_headers_get_431(limited_url: str) -> None:
    """More headers than max_headers are answered 431 and the connection is closed."""
    stream = await _connect(limited_url)
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(30))
    await stream.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
    answer = await _read_all(stream)
    await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 431 ")


async def test_partial_headers_are_cut_at_the_header_deadline(limited_url: str) -> None:
    """A connection that stops half-way through its headers is closed by the server (deadline 0.5 s)."""
    stream = await _connect(limited_url)
    await stream.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    assert await _read_all(stream) == b""  # closed, within _read_all's 10 s bound
    await stream.aclose()


async def test_silent_connection_is_cut_at_the_header_deadline(limited_url: str) -> None:
    """A connection that sends nothing is closed by the server."""
    stream = await _connect(limited_url)
    assert await _read_all(stream) == b""
    await stream.aclose()


async def test_partial_body_is_cut_at_the_body_deadline(limited_url: str) -> None:
    """An authenticated request whose body never finishes is closed by the server (deadline 0.5 s)."""
    stream = await _connect(limited_url)
    host = urlsplit(limited_url).netloc.encode()
    token = TOKENS["alice"].encode()
    await stream.send(
        b"POST /mcp HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: Bearer " + token + b"\r\n"
        b"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    answer = await _read_all(stream)
    await stream.aclose()
    assert b" 200 " not in answer.split(b"\r\n", 1)[0]


async def test_idle_connections_per_address_are_capped_and_cut(limited_url: str) -> None:
    """Past max_unauthenticated_connections_per_address idle connections the next waits, unread; the idle
    ones are cut at the header deadline, and the waiting one is then served (issue #22: no reset)."""
    held = [await _connect(limited_url) for _ in range(PER_ADDRESS)]
    extra = await _connect(limited_url)
    await extra.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    answer = await _read_all(extra)
    await extra.aclose()
    cut = [await _read_all(stream) for stream in held]
    for stream in held:
        await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert cut == [b""] * PER_ADDRESS
    assert await _healthz(limited_url) == 200


def _rss_kib(pid: int) -> int:
    match = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    assert match is not None
    return int(match.group(1))


def test_bastion_serve_refuses_a_1_mib_header_without_growing(tmp_path: Path) -> None:
    """`bastion serve` applies gateway.max_header_bytes: a 1 MiB header gets 431, the process stays small."""
    config = tmp_path / "gateway.toml"
    config.write_text(f'[gateway]\nmax_header_bytes = 2048\n\n[servers.tools]\nurl = "{DEAD_URL}"\n')
    serve = Serve("--config", str(config), "--data-dir", str(tmp_path / "data"))
    try:
        _refuses_a_huge_header(serve)
    finally:
        serve.stop()


def _refuses_a_huge_header(serve: Serve) -> None:
    url = serve.ready_line().split()[2]
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    rss_before = _rss_kib(serve.process.pid)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        cut = False
        try:
            for _ in range(16):
                sock.sendall(b"a" * 65_536)
            sock.sendall(b"\r\n\r\n")
        except OSError:
            cut = True  # cut while sending: the answer may still be readable
        try:
            answer = sock.recv(64)
        except OSError:
            answer = b""
    assert answer.startswith(b"HTTP/1.1 431 ") or (cut and answer == b"")
    assert serve.process.poll() is None
    assert _rss_kib(serve.process.pid) - rss_before < 8 * 1024
