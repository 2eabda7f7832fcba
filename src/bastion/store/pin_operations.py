"""The pin contract (``store/pins.py``) over any engine's ``_write`` and ``_read`` (issue 27)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from bastion.store.ops import pins
from bastion.store.pins import PinKind, PinRecord
from bastion.store.rows import dumps, to_us
from bastion.store.statements import OpFactory

__all__ = ["PinOperations"]

T = TypeVar("T")


class PinOperations:
    """Mixin of :class:`~bastion.store.operations.StoreOperations`: the pin methods."""

    async def _write(self, op: OpFactory[T]) -> T:
        raise NotImplementedError

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        raise NotImplementedError

    async def list_pins(self, *, server: str | None = None) -> list[PinRecord]:
        return await self._read(lambda: pins.list_pins(server))

    async def get_pin(self, server: str, kind: PinKind, name: str) -> PinRecord | None:
        kind = PinKind(kind)
        return await self._read(lambda: pins.get_pin(server, kind, name))

    async def pin_first(
        self, server: str, kind: PinKind, name: str, digest: str, definition: dict[str, Any], *, now: datetime
    ) -> PinRecord:
        kind, definition_json, now_us = PinKind(kind), dumps(definition), to_us(now)
        return await self._write(lambda: pins.pin_first(server, kind, name, digest, definition_json, now_us))

    async def offer_pin(
        self, server: str, kind: PinKind, name: str, digest: str, definition: dict[str, Any], *, now: datetime
    ) -> tuple[PinRecord, bool]:
        kind, definition_json, now_us = PinKind(kind), dumps(definition), to_us(now)
        return await self._write(lambda: pins.offer_pin(server, kind, name, digest, definition_json, now_us))

    async def decide_pin(
        self, server: str, kind: PinKind, name: str, digest: str, *, approve: bool, by: str, now: datetime
    ) -> PinRecord:
        kind, now_us = PinKind(kind), to_us(now)
        return await self._write(lambda: pins.decide_pin(server, kind, name, digest, approve, by, now_us))
