"""Pass :class:`~bastion.store.pins.PinStore` through a wrapping store unchanged (issue 27)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from bastion.store.pins import PinKind, PinRecord, PinStore

__all__ = ["PinStorePassthrough"]


class _Wrapper(Protocol):
    @property
    def inner(self) -> PinStore: ...


class PinStorePassthrough:
    """Mixin: every pin call goes to ``self.inner``."""

    async def list_pins(self: _Wrapper, *, server: str | None = None) -> list[PinRecord]:
        return await self.inner.list_pins(server=server)

    async def get_pin(self: _Wrapper, server: str, kind: PinKind, name: str) -> PinRecord | None:
        return await self.inner.get_pin(server, kind, name)

    async def pin_first(
        self: _Wrapper,
        server: str,
        kind: PinKind,
        name: str,
        digest: str,
        definition: dict[str, Any],
        *,
        now: datetime,
    ) -> PinRecord:
        return await self.inner.pin_first(server, kind, name, digest, definition, now=now)

    async def offer_pin(
        self: _Wrapper,
        server: str,
        kind: PinKind,
        name: str,
        digest: str,
        definition: dict[str, Any],
        *,
        now: datetime,
    ) -> tuple[PinRecord, bool]:
        return await self.inner.offer_pin(server, kind, name, digest, definition, now=now)

    async def decide_pin(
        self: _Wrapper,
        server: str,
        kind: PinKind,
        name: str,
        digest: str,
        *,
        approve: bool,
        by: str,
        now: datetime,
    ) -> PinRecord:
        return await self.inner.decide_pin(server, kind, name, digest, approve=approve, by=by, now=now)
