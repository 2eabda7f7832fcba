"""Caller.with_relay: the per-request copy that replaces dataclasses.replace on the hot path."""

from __future__ import annotations

import dataclasses
from typing import Any

from bastion.caller import Caller


def test_with_relay_keeps_every_other_field() -> None:
    """with_relay equals dataclasses.replace(relay=...) field for field, whatever fields Caller has."""
    values: dict[str, Any] = {field.name: object() for field in dataclasses.fields(Caller)}
    caller = Caller(**values)
    relay = object()
    copied = caller.with_relay(relay)  # type: ignore[arg-type]
    assert copied == dataclasses.replace(caller, relay=relay)
    assert copied.relay is relay
    for field in dataclasses.fields(Caller):
        if field.name != "relay":
            assert getattr(copied, field.name) is values[field.name]
