"""HTTP/1.1 to HTTP upstreams: one asyncio protocol per connection, parsed by httptools, pooled.

The upstream side sends a handful of request shapes (a JSON-RPC POST, a GET for an
SSE stream, a DELETE) to a few known upstreams, and reads each answer once, as it
comes. A general client (aiohttp, httpx2) spends most of its CPU on what this needs
none of (redirects, cookies, proxies, middlewares, multipart, per-request objects), so
this module does only the exchange, with the response parsed by ``httptools`` (llhttp,
the parser uvicorn uses). Measured with ``bench/upstream_clients.py``.

Owns: the wire format of a request (and refusing a header name or value that could
split it), the connection's state while a response is read (status, headers, body
chunks, end), back-pressure, the read bound, and the pool: kept-alive connections per
(scheme, host, port), at most ``max_connections`` open, idle ones let go after
``keepalive_s``. Raises only the failures below; ``http_client.py`` is the facade the
upstreams use.

A connection carries one exchange at a time. It goes back to the pool only when its
response was read to the end and both sides allow keep-alive; anything else (an early
close, a cancelled read, a parse error, bytes nobody asked for) closes it, which is how
the sessionless era cancels a request upstream.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

__all__ = [
    "ConnectError",
    "Connection",
    "ConnectionPool",
    "HttpFailure",
    "HttpTimeout",
    "StreamBroken",
    "Target",
    "request_head",
    "target_of",
]

# Past this many unread body bytes the socket stops being read until the reader catches up.
_HIGH_WATER = 256 * 1024
_MAX_HEADER_BYTES = 64 * 1024
_MAX_HEADERS = 128
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_USER_AGENT = "bastion"
# Written by this module whatever the caller passes.
_OURS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "user-agent"}
)


class HttpFailure(Exception):
    """An upstream HTTP exchange failed below HTTP (no status to judge)."""


class ConnectError(HttpFailure):
    """No connection: the request was never sent."""


class HttpTimeout(HttpFailure):
    """The upstream sent nothing within the read bound."""


class StreamBroken(HttpFailure):
    """The connection broke after the request may have been sent."""


class Target:
    """Where a URL's requests go, parsed once per URL."""

    __slots__ = ("head_prefix", "host", "key", "port", "request_target", "scheme", "ssl")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectError(f"not an http(s) URL: {parts.scheme}://{parts.hostname or ''}")
        self.scheme = parts.scheme
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        default = 443 if self.ssl else 80
        self.port = parts.port or default
        self.key = (self.scheme, self.host, self.port)
        path = parts.path or "/"
        self.request_target = f"{path}?{parts.query}" if parts.query else path
        shown = f"[{self.host}]" if ":" in self.host else self.host
        host_header = shown if self.port == default else f"{shown}:{self.port}"
        self.head_prefix = (
            f"\r\nhost: {host_header}\r\nuser-agent: {_USER_AGENT}\r\naccept-encoding: identity\r\n"
        )


@lru_cache(maxsize=256)
def target_of(url: str) -> Target:
    return Target(url)


@lru_cache(maxsize=1024)
def _valid_name(name: str) -> bool:
    return _TOKEN.fullmatch(name) is not None


def request_head(
    method: str, target: Target, headers: Mapping[str, str], content_length: int | None
) -> bytes:
    """The request line and header block; raises ``ValueError`` for a header that could split it."""
    lines = [method, " ", target.request_target, " HTTP/1.1", target.head_prefix]
    for name, value in headers.items():
        if not _valid_name(name) or "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"header {name!r} is not a valid HTTP field")
        lowered = name.lower()
        if lowered in _OURS:
            continue  # this module frames the request
        lines.append(f"{name}: {value}\r\n")
    if content_length is not None:
        lines.append(f"content-length: {content_length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection to an upstream, and the response being read on it."""

    def __init__(self, pool: ConnectionPool, key: tuple[str, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self._parser: Any = None
        self._header_list: list[tuple[str, str]] = []
        self._header_bytes = 0
        self.status = 0
        self.headers: dict[str, str] | None = None
        self.chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self.complete = False
        self.keep_alive = False
        self._until_close = False
        self.error: HttpFailure | None = None
        self._waiter: asyncio.Future[None] | None = None

    # ---------------------------------------------------------------- one exchange

    def send(self, head: bytes, content: bytes | None) -> None:
        """Start an exchange: a fresh parser, then the request written whole."""
        self._parser = httptools.HttpResponseParser(self)
        self._header_list = []
        self._header_bytes = 0
        self.headers = None
        self.chunks.clear()
        self._buffered = 0
        self.complete = self.keep_alive = self._until_close = False
        self.error = None
        assert self.transport is not None
        self.transport.write(head + content if content else head)

    async def wait(self, read_timeout_s: float | None) -> None:
        """Until something happens on this exchange (headers, a chunk, its end, an error)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = (
            None if read_timeout_s is None else loop.call_later(read_timeout_s, self._read_timed_out, waiter)
        )
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def take(self) -> bytes:
        """Every body chunk in so far, joined (empty when none)."""
        chunks = self.chunks
        if len(chunks) == 1:
            data = chunks.popleft()
        else:
            data = b"".join(chunks)
            chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and self.error is None and not self.closed

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.pool.forget(self)
        if self._parser is not None and not self.complete and self.error is None:
            if self._until_close and self.headers is not None:
                self.complete = True  # a body delimited by the connection's end has ended
            else:
                why = (
                    f"{type(exc).__name__}: {exc}"
                    if exc is not None
                    else "the upstream closed the connection"
                )
                self.error = StreamBroken(why)
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self._parser is None or self.complete:
            self.error = self.error or StreamBroken("the upstream sent bytes no request asked for")
            self.abort()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the upstream switched protocols")
        except httptools.HttpParserError as exc:
            self._fail(f"malformed HTTP response: {exc}")

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost judges what was read

    # ---------------------------------------------------------------- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > _MAX_HEADER_BYTES or len(self._header_list) >= _MAX_HEADERS:
            raise httptools.HttpParserError("response headers over the bound")
        self._header_list.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        headers: dict[str, str] = {}
        for name, value in self._header_list:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.status = self._parser.get_status_code()
        self._until_close = "content-length" not in headers and "transfer-encoding" not in headers
        self.headers = headers
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = bool(self._parser.should_keep_alive())  # False for a body ended by EOF
        self._wake()

    # ---------------------------------------------------------------- internals

    def _fail(self, why: str) -> None:
        self.error = StreamBroken(why)
        self.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _read_timed_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(HttpTimeout("no byte from the upstream within the read bound"))

    def expire(self) -> None:
        """The idle bound passed while pooled: let it go."""
        self.idle_timer = None
        self.abort()


class ConnectionPool:
    """Kept-alive connections per upstream; at most ``max_connections`` open in all."""

    def __init__(self, *, connect_timeout_s: float, max_connections: int, keepalive_s: float) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max = max_connections
        self._keepalive_s = keepalive_s
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._open: set[Connection] = set()
        self._connecting = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def acquire(self, target: Target) -> Connection:
        """A connection to ``target``: a kept-alive one, else a new one. Raises ``ConnectError``.

        At the bound, an idle connection to another upstream is let go for it, else the
        request waits for a released or closed one, within the connect bound.
        """
        if self._closed:
            raise ConnectError("the upstream HTTP client is closed")
        conn = self._take_idle(target.key)
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                while len(self._open) + self._connecting >= self._max:
                    if self._drop_one_idle():
                        continue
                    waiter = loop.create_future()
                    self._slot_waiters.append(waiter)
                    await waiter
                    if self._closed:
                        raise ConnectError("the upstream HTTP client is closed")
                    conn = self._take_idle(target.key)
                    if conn is not None:
                        return conn
                return await self._connect(loop, target)
        except TimeoutError:
            where = f"{target.host}:{target.port}"
            raise ConnectError(f"no connection to {where} within the connect bound") from None

    def _take_idle(self, key: tuple[str, str, int]) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
                conn.idle_timer = None
            if not conn.closed:
                return conn
        return None

    def release(self, conn: Connection) -> None:
        """Back to the pool when reusable, else closed."""
        if self._closed or not conn.reusable():
            conn.abort()
            self.forget(conn)
            return
        conn.idle_timer = asyncio.get_running_loop().call_later(self._keepalive_s, conn.expire)
        self._idle.setdefault(conn.key, []).append(conn)
        if self._slot_waiters:
            self._free_slot()  # a request waiting at the bound may take it

    def forget(self, conn: Connection) -> None:
        """A connection that closed: out of the pool, its slot free."""
        if conn in self._open:
            self._open.discard(conn)
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._free_slot()

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn.abort()
        self._open.clear()
        self._idle.clear()
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def _connect(self, loop: asyncio.AbstractEventLoop, target: Target) -> Connection:
        self._connecting += 1
        conn: Connection | None = None
        try:
            transport, conn = await loop.create_connection(
                lambda: Connection(self, target.key),
                target.host,
                target.port,
                ssl=self._ssl_context() if target.ssl else None,
                server_hostname=target.host if target.ssl else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from None
        finally:
            self._connecting -= 1
            if conn is None:
                self._free_slot()  # the slot this attempt held goes to the next waiter
        if conn.closed:
            raise ConnectError(f"{target.host}:{target.port} closed the connection at once")
        # uvloop may call connection_made only after create_connection returns.
        conn.transport = conn.transport or transport
        self._open.add(conn)
        return conn

    def _drop_one_idle(self) -> bool:
        """At the bound, an idle connection (the oldest of an upstream's) gives its slot to a new one."""
        for idle in self._idle.values():
            if idle:
                conn = idle.pop(0)
                if conn.idle_timer is not None:
                    conn.idle_timer.cancel()
                    conn.idle_timer = None
                conn.abort()
                self.forget(conn)
                return True
        return False

    def _free_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl
