"""The pooled HTTP client of the upstream side, on aiohttp (issue #13, "Lean I/O").

Measured with ``bench/upstream_clients.py`` against the bundled upstream, aiohttp spends
about a third of httpx2's client CPU per request, in both eras. This module is the one
place that knows it: the upstreams see :class:`UpstreamHttp` and :class:`UpstreamResponse`,
and four failures of their own, so the typed errors of ``errors.py`` are decided by
``upstream/streamable_http.py`` as before:

- :class:`ConnectError`: nothing was sent (refused, unreachable, no connection within the
  connect bound, which covers waiting for a free pooled connection);
- :class:`HttpTimeout`: no byte within the read bound once sent;
- :class:`StreamBroken`: the connection broke after the request may have been sent;
- all three are :class:`HttpFailure`;
- :class:`BodyOverLimit` (not an ``HttpFailure``: the exchange worked, the body is too large):
  a body read with a ``limit`` passed it; reading stopped there and the connection is closed.

Owns: one connection pool per gateway process (per host at most ``max_connections``),
kept-alive connections, the connect and read bounds. A response read to its end goes
back to the pool; one closed early (cancellation, an abandoned stream) closes its
connection, which is how the sessionless era cancels a request. Never logs bodies or
headers; never follows redirects; never reads proxies from the environment; keeps no cookies.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from bastion.policy.snapshot import DEFAULT_MAX_RESPONSE_BYTES

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


class HttpFailure(Exception):
    """An upstream HTTP exchange failed below HTTP (no status to judge)."""


class ConnectError(HttpFailure):
    """No connection: the request was never sent."""


class HttpTimeout(HttpFailure):
    """The upstream sent nothing within the read bound."""


class StreamBroken(HttpFailure):
    """The connection broke after the request may have been sent."""


class BodyOverLimit(Exception):
    """A body passed the bound it was read with; no more of it was read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body over {limit} bytes")
        self.limit = limit


def _failure(exc: BaseException) -> HttpFailure:
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return ConnectError(str(exc) or type(exc).__name__)
    if isinstance(exc, TimeoutError):
        return HttpTimeout(str(exc) or type(exc).__name__)
    return StreamBroken(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class UpstreamResponse:
    """One response: status and headers at once, the body streamed or read whole."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.headers: CIMultiDictProxy[str] = response.headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body's chunks as they come. Raises ``HttpFailure``."""
        content = self._response.content
        while True:
            try:
                chunk = await content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _failure(exc) from exc
            if not chunk:
                return
            yield chunk

    async def aread(self, limit: int = DEFAULT_MAX_RESPONSE_BYTES) -> bytes:
        """The whole body, read chunk by chunk and never past ``limit`` bytes.

        Raises:
            BodyOverLimit: the body (or its declared length) passed ``limit``; reading stopped.
            HttpFailure: the connection failed.
        """
        # A declared length counts the encoded bytes; a compressed body is bounded as it is decoded.
        declared = self._response.content_length
        if declared is not None and declared > limit:
            raise BodyOverLimit(limit)
        try:
            if declared is not None and self.headers.get("content-encoding", "identity") == "identity":
                return await self._response.read()  # the parser reads no byte past the declared length
            pieces: list[bytes] = []
            size = 0
            while chunk := await self._response.content.readany():
                size += len(chunk)
                if size > limit:
                    raise BodyOverLimit(limit)
                pieces.append(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(exc) from exc
        return b"".join(pieces)

    async def drop_body(self, limit: int = _DROPPED_BODY_BYTES) -> None:
        """Read the body to its end without keeping it (the connection then goes back to the pool);
        past ``limit`` bytes stop (``close`` then closes the connection). Raises ``HttpFailure``."""
        size = 0
        async for chunk in self.aiter_bytes():
            size += len(chunk)
            if size > limit:
                return

    def close(self) -> None:
        """Give the connection back if the body was read to its end, else close it."""
        if self._response.content.is_eof():
            self._response.release()
        else:
            self._response.close()


class UpstreamHttp:
    """The gateway's pooled client for every HTTP upstream (created lazily, inside the event loop)."""

    def __init__(self, *, read_timeout_s: float, connect_timeout_s: float = 5.0, max_connections: int = 256):
        self._read_timeout_s = read_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # Idle connections are let go before common servers' own keep-alive bound (uvicorn: 5 s),
                # so a request is rarely sent on a connection the server is just closing.
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self._connect_timeout_s, sock_read=self._read_timeout_s
                ),
                trust_env=False,
                # One pool serves every client session: an upstream's cookie kept for one
                # client's call would ride on another's. No jar (and no per-request lookup).
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

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
        Raises ``HttpFailure``.
        """
        options: dict[str, Any] = {}
        if read_timeout_s is not _UNSET:
            options["timeout"] = aiohttp.ClientTimeout(
                total=None, connect=self._connect_timeout_s, sock_read=read_timeout_s
            )
        try:
            raw = await self._client().request(
                method, url, headers=dict(headers), data=content, allow_redirects=False, **options
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(exc) from exc
        response = UpstreamResponse(raw)
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
        if self._session is not None:
            await self._session.close()
            self._session = None
