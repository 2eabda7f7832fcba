"""Operations on pinned definitions (``store/pins.py``), written once for both engines (issue 27)."""

from __future__ import annotations

import json
from typing import Any

from bastion.errors import Conflict
from bastion.store.pins import OfferState, PinKind, PinRecord
from bastion.store.replicas import ChangeKind
from bastion.store.rows import dumps, from_us, maybe_from_us
from bastion.store.statements import Op, execute, one, rows

SELECT_PIN = (
    "SELECT server, kind, name, digest, definition, pinned_at, pinned_by, offered_digest,"
    " offered_definition, offered_at, offer_state, decided_at, decided_by FROM pins"
)


def pin_from_row(row: tuple[Any, ...]) -> PinRecord:
    return PinRecord(
        row[0], PinKind(row[1]), row[2], row[3], json.loads(row[4]), from_us(row[5]), row[6], row[7],
        None if row[8] is None else json.loads(row[8]), maybe_from_us(row[9]),
        None if row[10] is None else OfferState(row[10]), maybe_from_us(row[11]), row[12],
    )  # fmt: skip


def list_pins(server: str | None) -> Op[list[PinRecord]]:
    order = " ORDER BY server, kind, name"
    if server is None:
        found = yield from rows(SELECT_PIN + order)
    else:
        found = yield from rows(SELECT_PIN + " WHERE server = ?" + order, server)
    return [pin_from_row(row) for row in found]


def get_pin(server: str, kind: PinKind, name: str, lock: str = "") -> Op[PinRecord | None]:
    row = yield from one(
        SELECT_PIN + " WHERE server = ? AND kind = ? AND name = ?",
        server, kind.value, name, lock=lock,
    )  # fmt: skip
    return None if row is None else pin_from_row(row)


def pin_first(
    server: str, kind: PinKind, name: str, digest: str, definition_json: str, now_us: int
) -> Op[PinRecord]:
    yield from execute(
        "INSERT INTO pins (server, kind, name, digest, definition, pinned_at, pinned_by)"
        " VALUES (?, ?, ?, ?, ?, ?, 'first_use') ON CONFLICT (server, kind, name) DO NOTHING",
        server, kind.value, name, digest, definition_json, now_us,
    )  # fmt: skip
    pin = yield from get_pin(server, kind, name)
    assert pin is not None
    return pin


def offer_pin(
    server: str, kind: PinKind, name: str, digest: str, definition_json: str, now_us: int
) -> Op[tuple[PinRecord, bool]]:
    pin = yield from get_pin(server, kind, name, lock="FOR UPDATE")
    if pin is None:
        raise Conflict("no pin to offer a change against", server=server, name=name)
    if digest in (pin.digest, pin.offered_digest):
        return pin, False
    yield from execute(
        "UPDATE pins SET offered_digest = ?, offered_definition = ?, offered_at = ?, offer_state = ?,"
        " decided_at = NULL, decided_by = NULL WHERE server = ? AND kind = ? AND name = ?",
        digest, definition_json, now_us, OfferState.PENDING.value, server, kind.value, name,
    )  # fmt: skip
    offered = yield from get_pin(server, kind, name)
    assert offered is not None
    return offered, True


def decide_pin(
    server: str, kind: PinKind, name: str, digest: str, approve: bool, by: str, now_us: int
) -> Op[PinRecord]:
    pin = yield from get_pin(server, kind, name, lock="FOR UPDATE")
    if pin is None or pin.offered_digest is None:
        raise Conflict("no changed definition is waiting for a decision", server=server, name=name)
    if pin.offered_digest != digest:
        raise Conflict("the offered definition is not the one named: show it again", server=server, name=name)
    if approve:
        yield from execute(
            "UPDATE pins SET digest = offered_digest, definition = offered_definition, pinned_at = ?,"
            " pinned_by = ?, offered_digest = NULL, offered_definition = NULL, offered_at = NULL,"
            " offer_state = NULL, decided_at = ?, decided_by = ? WHERE server = ? AND kind = ? AND name = ?",
            now_us, by, now_us, by, server, kind.value, name,
        )  # fmt: skip
    else:
        yield from execute(
            "UPDATE pins SET offer_state = ?, decided_at = ?, decided_by = ?"
            " WHERE server = ? AND kind = ? AND name = ?",
            OfferState.REJECTED.value, now_us, by, server, kind.value, name,
        )  # fmt: skip
    detail = dumps({"kind": kind.value, "name": name, "digest": digest, "approved": approve})
    yield from execute(
        "INSERT INTO changes (kind, subject, detail, origin, at) VALUES (?, ?, ?, NULL, ?)",
        ChangeKind.PINS_CHANGED.value, server, detail, now_us,
    )  # fmt: skip
    decided = yield from get_pin(server, kind, name)
    assert decided is not None
    return decided
