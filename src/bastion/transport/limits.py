"""Pre-authentication bounds on the HTTP front door (issues #12, #22): what a peer costs before a credential.

uvicorn's httptools protocol has no cap on header size or count, no deadline to finish the
headers or the body, and no per-address connection cap. ``limited_protocol`` returns a
subclass that adds them; each served gateway builds its own (the per-address counts live in
the returned class, never in module state). Over a size cap: 431 and close; past a deadline:
close.

Connections per address count only what has not authenticated yet (issue #22 point 6): a
connection is *unauthenticated* until a request on it presents a valid credential (the front
door says so through the scope extension :data:`AUTHENTICATED_EXTENSION`,
:func:`note_authenticated`); from then on it is the agent's, and the caps that apply are the
agent's (``transport/agent_limits.py``), so many clients on one host, or every client behind
one proxy, are kept apart, not out. Past ``max_unauthenticated_connections_per_address`` a new
connection is not refused: it waits, unread, for a slot (first come, first served), and is
closed if none frees within ``header_timeout_s``; only past ``WAITING_FACTOR`` times the cap
of waiting ones is it closed at once. A peer in ``trusted_proxies`` carries many clients: its
connections are not counted per address (the proxy bounds its own clients), only deadlines apply.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bastion.policy.snapshot import GatewaySettings

__all__ = [
    "AUTHENTICATED_EXTENSION",
    "WAITING_FACTOR",
    "FrontDoorLimits",
    "front_door_limits",
    "limited_protocol",
    "note_authenticated",
    "uvicorn_options",
]

#: The scope extension through which the front door tells the connection a request authenticated.
AUTHENTICATED_EXTENSION: Final[str] = "io.bastion.connection_authenticated"
#: Connections that may wait for an unauthenticated slot, per address, as a multiple of the cap.
WAITING_FACTOR: Final[int] = 16


@dataclass(frozen=True)
class FrontDoorLimits:
    """The bounds, from ``[gateway]`` (policy/snapshot.py)."""

    max_header_bytes: int = 16_384
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_unauthenticated_connections_per_address: int = 64
    trusted_proxies: tuple[str, ...] = ()


def front_door_limits(settings: GatewaySettings, trusted_proxies: tuple[str, ...] = ()) -> FrontDoorLimits:
    """The bounds that ``[gateway]`` names (read at start; a reload does not change them).

    ``trusted_proxies`` is the one list of proxies the gateway believes (``auth.mtls_trusted_proxies``).
    """
    return FrontDoorLimits(
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        keep_alive_s=settings.keep_alive_s,
        max_unauthenticated_connections_per_address=settings.max_unauthenticated_connections_per_address,
        trusted_proxies=tuple(trusted_proxies),
    )


def note_authenticated(scope: Scope) -> None:
    """Tell the connection this request came in on that it authenticated (no-op outside ``bastion serve``)."""
    mark = (scope.get("extensions") or {}).get(AUTHENTICATED_EXTENSION)
    if callable(mark):
        mark()


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; ``send_400_response`` then answers 431."""


def limited_protocol(limits: FrontDoorLimits) -> type[HttpToolsProtocol]:
    """An httptools protocol class enforcing ``limits``, with its own per-address connection counts."""
    cap = limits.max_unauthenticated_connections_per_address
    unauthenticated: dict[str, int] = {}  # per address: connections being read, not yet authenticated
    waiting: dict[str, deque[LimitedProtocol]] = {}  # per address: connections waiting, unread, for a slot
    trusted = frozenset(limits.trusted_proxies)

    def admit_waiting(address: str) -> None:
        queue = waiting.get(address)
        while queue and unauthenticated.get(address, 0) < cap:
            queue.popleft().admit()
        if queue is not None and not queue:
            del waiting[address]

    class LimitedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._address: str | None = None
            self._counted = False  # holds one of its address's unauthenticated slots
            self._waiting = False
            self._in_head = True
            self._head_bytes = 0  # bytes of whole chunks that arrived while the headers were incomplete
            self._header_bytes = 0  # exact: request line and complete headers
            self._header_count = 0
            self._too_large = False
            self._timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else "?"
            self._address = address
            if address in trusted:
                self._arm(limits.header_timeout_s)
                return
            if unauthenticated.get(address, 0) < cap:
                self.admit()
                return
            queue = waiting.setdefault(address, deque())
            if len(queue) >= cap * WAITING_FACTOR:
                self._address = None
                transport.close()  # refused before reading a byte: the address holds enough already
                return
            # Not refused: read once a connection of this address authenticates or goes.
            self._waiting = True
            self.flow.pause_reading()
            queue.append(self)
            self._arm(limits.header_timeout_s)

        def admit(self) -> None:
            """Take an unauthenticated slot of this address and start (or resume) reading."""
            assert self._address is not None
            unauthenticated[self._address] = unauthenticated.get(self._address, 0) + 1
            self._counted = True
            if self._waiting:
                self._waiting = False
                self.flow.resume_reading()
            self._arm(limits.header_timeout_s)

        def authenticated(self) -> None:
            """A request on this connection presented a valid credential: it leaves the address's pool."""
            self._release()

        def _release(self) -> None:
            if not self._counted or self._address is None:
                return
            self._counted = False
            left = unauthenticated[self._address] - 1
            if left:
                unauthenticated[self._address] = left
            else:
                del unauthenticated[self._address]
            admit_waiting(self._address)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._address is not None:
                if self._waiting:
                    self._waiting = False
                    queue = waiting.get(self._address)
                    if queue is not None:
                        with contextlib.suppress(ValueError):
                            queue.remove(self)
                        if not queue:
                            del waiting[self._address]
                self._release()
                self._address = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope["extensions"] = {AUTHENTICATED_EXTENSION: self.authenticated}  # type: ignore[dict-item]
            self._in_head = True
            self._head_bytes = self._header_bytes = self._header_count = 0
            if self._timer is None:
                self._arm(limits.header_timeout_s)

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
