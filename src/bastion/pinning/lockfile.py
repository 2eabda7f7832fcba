"""The pin lock file: definitions reviewed like code (issue 27).

``bastion pin`` writes it from the live upstreams; a server with
``pinning = "lock"`` exposes only the definitions it holds. One JSON file may
hold several servers::

    {"bastion_pins": 1,
     "servers": {"notes": {"tool": {"echo": {"digest": "<sha256 hex>", "definition": {...}}}}}}

Keys and definitions are written sorted and indented so a review diff shows
exactly what changed. Reading checks every digest against its definition: a
hand edit that changes one without the other refuses the start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError
from bastion.pinning.digest import DefinitionUnpinnable, definition_digest
from bastion.store.pins import PinKind

__all__ = ["FORMAT_VERSION", "LockedPin", "read_lock_file", "write_lock_file"]

FORMAT_VERSION = 1
_MAX_LOCK_FILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LockedPin:
    digest: str
    definition: dict[str, Any]


LockedServer = dict[tuple[PinKind, str], LockedPin]


def read_lock_file(path: Path) -> dict[str, LockedServer]:
    """Every server's locked definitions in ``path``. Raises :class:`ConfigError` (one line)."""
    try:
        if path.stat().st_size > _MAX_LOCK_FILE_BYTES:
            raise ConfigError(f"{path}: pin lock file larger than {_MAX_LOCK_FILE_BYTES} bytes")
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: pin lock file missing: write it with `bastion pin`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: pin lock file unreadable: {type(exc).__name__}") from None
    if not isinstance(document, dict) or document.get("bastion_pins") != FORMAT_VERSION:
        raise ConfigError(f"{path}: not a pin lock file (bastion_pins = {FORMAT_VERSION} missing)")
    servers = document.get("servers")
    if not isinstance(servers, dict):
        raise ConfigError(f"{path}: servers must be an object")
    found: dict[str, LockedServer] = {}
    for server, kinds in servers.items():
        found[server] = _read_server(path, server, kinds)
    return found


def _read_server(path: Path, server: str, kinds: Any) -> LockedServer:
    if not isinstance(kinds, dict):
        raise ConfigError(f"{path}: servers.{server} must be an object")
    locked: LockedServer = {}
    for kind_name, names in kinds.items():
        if kind_name not in {k.value for k in PinKind} or not isinstance(names, dict):
            raise ConfigError(f"{path}: servers.{server}.{kind_name:.40}: not a definition kind")
        for name, pin in names.items():
            where = f"servers.{server}.{kind_name}.{name!r:.80}"
            if not isinstance(pin, dict) or not isinstance(pin.get("definition"), dict):
                raise ConfigError(f"{path}: {where} needs a digest and a definition")
            try:
                digest = definition_digest(pin["definition"])
            except DefinitionUnpinnable as exc:
                raise ConfigError(f"{path}: {where}: {exc}") from None
            if pin.get("digest") != digest or pin["definition"].get("name") != name:
                raise ConfigError(f"{path}: {where}: the digest does not match the definition")
            locked[(PinKind(kind_name), name)] = LockedPin(digest, pin["definition"])
    return locked


def write_lock_file(path: Path, servers: Mapping[str, LockedServer]) -> None:
    """Write ``servers`` to ``path`` atomically (a temporary file renamed over it)."""
    document: dict[str, Any] = {"bastion_pins": FORMAT_VERSION, "servers": {}}
    for server, locked in sorted(servers.items()):
        kinds: dict[str, dict[str, Any]] = {}
        for (kind, name), pin in sorted(locked.items()):
            kinds.setdefault(kind.value, {})[name] = {"digest": pin.digest, "definition": pin.definition}
        document["servers"][server] = kinds
    text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=True) + "\n"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
