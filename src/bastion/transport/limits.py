"""Pre-authentication bounds on the HTTP front door (issue #12): what a peer may cost before any credential.

uvicorn's httptools protocol has no cap on header size or count, no deadline to finish the
headers or the body, and no per-address connection cap. ``limited_protocol`` returns a
subclass that adds them; each served gateway builds its own (the per-address counts live in
the returned class, never in module state). Over a cap: 431 and close; past a deadline, or
past the per-address cap: close.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bastion.policy.snapshot import GatewaySettings

__all__ = ["FrontDoorLimits", "front_door_limits", "limited_protocol", "uvicorn_options"]


@dataclass(frozen=True)
class FrontDoorLimits:
    """The bounds, from ``[gateway]`` (policy/snapshot.py)."""

    max_header_bytes: int = 16_384
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections_per_address: int = 64


def front_door_limits(settings: GatewaySettings) -> FrontDoorLimits:
    """The bounds that ``[gateway]`` names (read at start; a reload does not change them)."""
    return FrontDoorLimits(
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        keep_alive_s=settings.keep_alive_s,
        max_connections_per_address=settings.max_connections_per_address,
    )


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; ``send_400_response`` then answers 431."""


def limited_protocol(limits: FrontDoorLimits) -> type[HttpToolsProtocol]:
    """An httptools protocol class enforcing ``limits``, with its own per-address connection counts."""
    per_address: dict[str, int] = {}

    class LimitedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._address: str | None = None
            self._in_head = True
            self._head_bytes = 0  # bytes of whole chunks that arrived while the headers were incomplete
            self._header_bytes = 0  # exact: request line and complete headers
            self._header_count = 0
            self._too_large = False
            self._timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else "?"
            if per_address.get(address, 0) >= limits.max_connections_per_address:
                transport.close()  # refused before reading a byte
                return
            per_address[address] = per_address.get(address, 0) + 1
            self._address = address
            self._arm(limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._address is not None:
                left = per_address[self._address] - 1
                if left:
                    per_address[self._address] = left
                else:
                    del per_address[self._address]
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._address is None or self.transport.is_closing():
                return
            super().data_received(data)
            if self._in_head and not self.transport.is_closing():
                # A header still arriving sits in the parser's buffer: bound it by what was received.
                # Whole chunks count, so a pipelined request may be charged its predecessor's tail.
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_header_bytes:
                    self._too_large = True
                    self.send_400_response("")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._head_bytes = self._header_bytes = self._header_count = 0
            if self._timer is None:
                self._arm(limits.header_timeout_s)

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            if self._header_count > limits.max_headers:
                self._too_large = True
                raise _Refused
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._arm(limits.body_timeout_s)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._too_large:
                super().send_400_response(msg)
                return
            reason = b"request header fields too large"
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: "
                + str(len(reason)).encode("ascii")
                + b"\r\nconnection: close\r\n\r\n"
                + reason
            )
            self.transport.close()

        def _count(self, size: int) -> None:
            self._header_bytes += size
            if self._header_bytes > limits.max_header_bytes:
                self._too_large = True
                raise _Refused

        def _arm(self, delay_s: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(delay_s, self._expire)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                self.transport.close()  # headers or body not received in time

    return LimitedProtocol


def uvicorn_options(limits: FrontDoorLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords that apply ``limits``."""
    return {"http": limited_protocol(limits), "timeout_keep_alive": limits.keep_alive_s}
