"""Operations on ``store_owners``: the signing keys (and data directories) a store belongs to (issue #23)."""

from __future__ import annotations

from typing import Any

from bastion.store.statements import Op, execute, one, rows


def list_owners() -> Op[list[tuple[Any, ...]]]:
    return (
        yield from rows("SELECT key_id, data_dir, joined_us FROM store_owners ORDER BY joined_us, key_id")
    )


def add_owner(key_id: str, data_dir: str, now_us: int) -> Op[None]:
    yield from execute(
        "INSERT INTO store_owners (key_id, data_dir, joined_us) VALUES (?, ?, ?)"
        " ON CONFLICT (key_id) DO NOTHING",
        key_id, data_dir, now_us,
    )  # fmt: skip


def probe() -> Op[None]:
    """The cheapest statement that proves the store answers: one row of ``schema_version``."""
    yield from one("SELECT version FROM schema_version")
