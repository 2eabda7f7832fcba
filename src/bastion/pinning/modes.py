"""How a server's definitions are pinned, as the operator configures it (issue 27).

``servers.NAME.pinning``: ``tofu`` (the default: the first definition seen is
pinned), ``lock`` (only definitions in the lock file ``servers.NAME.pin_lock_file``,
written by ``bastion pin``, are exposed) or ``off``. ``servers.NAME.pin_changed``:
what a definition that differs from its pin does: ``withhold`` (the default:
listed with its pinned definition, calls refused with ``definition_changed``)
or ``hide``. Read here so the policy loader keeps one line per key.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError

__all__ = ["PIN_KEYS", "PinChanged", "PinMode", "read_pinning"]

#: The keys of a ``[servers.NAME]`` table this module reads.
PIN_KEYS = frozenset({"pinning", "pin_changed", "pin_lock_file"})


class PinMode(enum.StrEnum):
    TOFU = "tofu"
    LOCK = "lock"
    OFF = "off"


class PinChanged(enum.StrEnum):
    WITHHOLD = "withhold"
    HIDE = "hide"


def read_pinning(
    table: Mapping[str, Any], key: str, source: Path | None, error: Callable[[str, str], ConfigError]
) -> dict[str, Any]:
    """``pinning``, ``pin_changed`` and ``pin_lock_file`` of one server table, as ServerSpec keywords.

    A relative lock file is taken from the configuration file's folder. Raises the
    :class:`ConfigError` ``error(key, defect)`` makes, one line naming the key.
    """
    found: dict[str, Any] = {}
    mode = _choice(table, "pinning", PinMode, key, error, "how this server's definitions are pinned")
    if mode is not None:
        found["pinning"] = mode
    changed = _choice(table, "pin_changed", PinChanged, key, error, "what a changed definition does")
    if changed is not None:
        found["pin_changed"] = changed
    lock_file = table.get("pin_lock_file")
    if lock_file is not None:
        if not isinstance(lock_file, str) or not lock_file:
            raise error(f"{key}.pin_lock_file", "must be a non-empty path")
        path = Path(lock_file)
        if not path.is_absolute() and source is not None:
            path = source.parent / path
        found["pin_lock_file"] = str(path)
    if found.get("pinning") is PinMode.LOCK and lock_file is None:
        raise error(
            f"{key}.pin_lock_file", 'missing: pinning = "lock" needs the lock file `bastion pin` writes'
        )
    if lock_file is not None and found.get("pinning") is not PinMode.LOCK:
        raise error(f"{key}.pin_lock_file", 'only a server with pinning = "lock" takes this key')
    return found


def _choice(
    table: Mapping[str, Any],
    name: str,
    choices: type[PinMode] | type[PinChanged],
    key: str,
    error: Callable[[str, str], ConfigError],
    meaning: str,
) -> Any:
    if name not in table:
        return None
    value = table[name]
    allowed = [c.value for c in choices]
    if not isinstance(value, str) or value not in allowed:
        listed = ", ".join(repr(c) for c in allowed)
        raise error(f"{key}.{name}", f"must be one of {listed} ({meaning}), got {value!r:.40}")
    return choices(value)
