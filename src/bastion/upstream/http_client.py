"""The pooled HTTP client of the upstream side (issue #13, "Lean I/O").

The upstreams see :class:`UpstreamHttp` and :class:`UpstreamResponse`, and four failures
of their own, so the typed errors of ``errors.py`` are decided by
``upstream/streamable_http.py``:

- :class:`ConnectError`: nothing was sent (refused, unreachable, no connection within the
  connect bound, which covers waiting for a free pooled connection);
- :class:`HttpTimeout`: no byte within the read bound once sent;
- :class:`StreamBroken`: the connection broke after the request may have been sent;
- all three are :class:`HttpFailure`;
- :class:`BodyOverLimit` (not an ``HttpFailure``: the exchange worked, the body is too large):
  a body read with a ``limit`` passed it; reading stopped there and the connection is closed.

The exchange itself is ``upstream/h1.py`` (HTTP/1.1 on asyncio and httptools, pooled):
measured with ``bench/upstream_clients.py`` against the bundled upstream, it spends well
under aiohttp's client CPU per request, and aiohttp about a third of httpx2's. This module
adds what the upstreams ask of a body: streamed chunks, a bounded whole read, a dropped
body, and the decoding of a compressed one (``identity`` is asked for; a gzip or deflate
body sent anyway is decoded, bounded as it is decoded).

A response read to its end goes back to the pool; one closed early (cancellation, an
abandoned stream) closes its connection, which is how the sessionless era cancels a
request. Never logs bodies or headers; never follows redirects; never reads proxies from
the environment; keeps no cookies.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from bastion.policy.snapshot import DEFAULT_MAX_RESPONSE_BYTES
from bastion.upstream.h1 import (
    ConnectError,
    Connection,
    ConnectionPool,
    HttpFailure,
    HttpTimeout,
    StreamBroken,
    request_head,
    target_of,
)

__all__ = [
    "BodyOverLimit",
    "ConnectError",
    "HttpFailure",
    "HttpTimeout",
    "StreamBroken",
    "UpstreamHttp",
    "UpstreamResponse",
]

_UNSET: Any = object()
_KEEPALIVE_S = 4.0
# A body read only to be dropped (``request``): past this, the connection is closed instead.
_DROPPED_BODY_BYTES = 1024 * 1024
# A compressed body is decoded at most this much at a time, so a small bomb never lands whole.
_DECODE_STEP = 64 * 1024
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_SENT_BODY = frozenset({"POST", "PUT", "PATCH"})


class BodyOverLimit(Exception):
    """A body passed the bound it was read with; no more of it was read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body over {limit} bytes")
        self.limit = limit


class UpstreamResponse:
    """One response: status and headers at once, the body streamed or read whole."""

    def __init__(self, conn: Connection, pool: ConnectionPool, read_timeout_s: float | None) -> None:
        assert conn.headers is not None
        self._conn = conn
        self._pool = pool
        self._read_timeout_s = read_timeout_s
        self.status_code = conn.status
        self.headers: Mapping[str, str] = conn.headers
        self._released = False

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body's chunks as they come (decoded). Raises ``HttpFailure``."""
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("identity", ""):
            return self._raw()  # no extra generator level per chunk
        return self._decoded(encoding)

    @property
    def ended(self) -> bool:
        """Whether the whole body is in and every byte of it was handed out."""
        return self._conn.complete and not self._conn.chunks

    async def _decoded(self, encoding: str) -> AsyncIterator[bytes]:
        wbits = _WBITS.get(encoding)
        if wbits is None:
            raise StreamBroken(f"the upstream answered content-encoding {encoding[:40]!r}, not asked for")
        decoder = zlib.decompressobj(wbits)
        try:
            async for chunk in self._raw():
                data = chunk
                while data:
                    piece = decoder.decompress(data, _DECODE_STEP)
                    data = decoder.unconsumed_tail
                    if piece:
                        yield piece
            if tail := decoder.flush():
                yield tail
        except zlib.error as exc:
            raise StreamBroken(f"the upstream's {encoding} body does not decode: {exc}") from None

    async def _raw(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
            elif conn.complete:
                return
            elif conn.error is not None:
                raise conn.error
            else:
                await conn.wait(self._read_timeout_s)

    async def aread(self, limit: int = DEFAULT_MAX_RESPONSE_BYTES) -> bytes:
        """The whole body, read chunk by chunk and never past ``limit`` bytes.

        Raises:
            BodyOverLimit: the body (or its declared length) passed ``limit``; reading stopped.
            HttpFailure: the connection failed.
        """
        # A declared length counts the encoded bytes; a compressed body is bounded as it is decoded.
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyOverLimit(limit)
        pieces: list[bytes] = []
        size = 0
        async for chunk in self.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise BodyOverLimit(limit)
            pieces.append(chunk)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def drop_body(self, limit: int = _DROPPED_BODY_BYTES) -> None:
        """Read the body to its end without keeping it (the connection then goes back to the pool);
        past ``limit`` bytes stop (``close`` then closes the connection). Raises ``HttpFailure``."""
        size = 0
        async for chunk in self._raw():
            size += len(chunk)
            if size > limit:
                return

    def close(self) -> None:
        """Give the connection back if the body was read to its end, else close it."""
        if not self._released:
            self._released = True
            self._pool.release(self._conn)


class UpstreamHttp:
    """The gateway's pooled client for every HTTP upstream (created lazily, inside the event loop)."""

    def __init__(self, *, read_timeout_s: float, connect_timeout_s: float = 5.0, max_connections: int = 256):
        self._read_timeout_s = read_timeout_s
        self._pool = ConnectionPool(
            connect_timeout_s=connect_timeout_s,
            max_connections=max_connections,
            # Idle connections are let go before common servers' own keep-alive bound (uvicorn: 5 s),
            # so a request is rarely sent on a connection the server is just closing.
            keepalive_s=_KEEPALIVE_S,
        )

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        content: bytes | None = None,
        read_timeout_s: float | None = _UNSET,
    ) -> AsyncIterator[UpstreamResponse]:
        """Send and yield the response once its headers are in; closed on exit.

        ``read_timeout_s`` overrides the client's read bound (``None``: none, for long streams).
        Raises ``HttpFailure``; ``ValueError`` for a header that is not a valid HTTP field.
        """
        read_timeout = self._read_timeout_s if read_timeout_s is _UNSET else read_timeout_s
        target = target_of(url)
        length = len(content) if content is not None else (0 if method in _SENT_BODY else None)
        head = request_head(method, target, headers, length)
        pool = self._pool
        conn = await pool.acquire(target)
        try:
            conn.send(head, content)
            while conn.headers is None:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(read_timeout)
        except BaseException:
            pool.release(conn)  # not reusable: closed
            raise
        response = UpstreamResponse(conn, pool, read_timeout)
        try:
            yield response
        finally:
            response.close()

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        content: bytes | None = None,
        read_timeout_s: float | None = _UNSET,
    ) -> UpstreamResponse:
        """Send and read the response; its body is dropped, never kept. Raises ``HttpFailure``."""
        async with self.stream(
            method, url, headers=headers, content=content, read_timeout_s=read_timeout_s
        ) as response:
            await response.drop_body()
            return response

    async def __aenter__(self) -> UpstreamHttp:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()
