"""The digest that commits a TRACE claim to the policy in force (DESIGN sections 4 and 8, issue #11 point 13).

A claim's ``policy.bundle_hash`` is ``sha256:`` + the SHA-256 of the RFC 8785
form of :func:`snapshot_document`: the whole compiled snapshot (gateway
settings, servers, agents, auth, requirements, grants), every frozen object
written as a JSON object of its public fields, enums as their values, sets as
sorted arrays. It is a 256-bit commitment to what was enforced, not to the
16-hex-digit ``version`` (a 64-bit prefix of the source file's hash, which
also changes with comments and spacing). ``version`` and ``source`` are left
out: the digest depends on the compiled policy only.

Upstream headers and environment values are part of the compiled policy and
so are committed to; only their digest leaves this module, never a value.
This module is pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from bastion.crypto.jcs import canonical_json
from bastion.policy.snapshot import Snapshot

__all__ = ["snapshot_digest", "snapshot_document"]

_LEFT_OUT = frozenset({"version", "source"})


def snapshot_document(snapshot: Snapshot) -> dict[str, Any]:
    """The compiled snapshot as a JSON object (what :func:`snapshot_digest` hashes)."""
    return {
        field.name: _plain(getattr(snapshot, field.name))
        for field in dataclasses.fields(snapshot)
        if field.name not in _LEFT_OUT
    }


def snapshot_digest(snapshot: Snapshot) -> str:
    """``sha256:<hex>`` of the RFC 8785 form of :func:`snapshot_document`."""
    return "sha256:" + hashlib.sha256(canonical_json(snapshot_document(snapshot))).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _plain(getattr(value, field.name))
            for field in dataclasses.fields(value)
            if not field.name.startswith("_")
        }
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, frozenset | set):
        return sorted((_plain(item) for item in value), key=canonical_json)
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"no JSON form for a {type(value).__name__} in the policy snapshot")
