"""Where a configuration error points, and how a value is checked and named in it (DESIGN section 8).

Owns :class:`LoadContext` (the file errors name, the environment ``${NAME}`` reads), the key
path of a TOML key as the file would spell it, and how a value's type is named. An error names
the key and the defect, never the value: values may be credentials.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bastion.errors import ConfigError

__all__ = ["LoadContext", "key_path", "type_name"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# One pass over the text: ``$$``, ``${NAME}``, or a ``$`` that is neither.
_DOLLAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$")

_T = TypeVar("_T")


def key_path(parent: str, key: str) -> str:
    part = key if _BARE_KEY.match(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{parent}.{part}" if parent else part


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class LoadContext:
    """Where errors point (the file) and where ``${NAME}`` is looked up."""

    source: Path | None
    environ: Mapping[str, str]

    def error(self, key: str, defect: str) -> ConfigError:
        where = f"{key}: {defect}" if key else defect
        prefix = f"{self.source}: " if self.source is not None else ""
        return ConfigError(f"{prefix}{where}", key=key)

    def build(self, factory: Callable[..., _T], **kwargs: Any) -> _T:
        """Call a snapshot constructor, prefixing the file name to its ConfigError."""
        try:
            return factory(**kwargs)
        except ConfigError as exc:
            prefix = f"{self.source}: " if self.source is not None else ""
            raise ConfigError(f"{prefix}{exc.message}", **exc.data) from None

    def refuse_unknown(self, table: Mapping[str, Any], allowed: frozenset[str], key: str) -> None:
        for name in table:
            if name not in allowed:
                expected = ", ".join(sorted(allowed))
                raise self.error(key_path(key, name), f"unknown key (expected one of: {expected})")

    def table(self, value: Any, key: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a table, got {type_name(value)}")
        for name in value:
            if not isinstance(name, str):
                raise self.error(key, f"expected string keys, got {type_name(name)}")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {type_name(value)}")
        return value

    def string_list(self, value: Any, key: str) -> list[str]:
        if not isinstance(value, list | tuple):
            raise self.error(key, f"expected an array of strings, got {type_name(value)}")
        return [self.string(item, f"{key}[{index}]") for index, item in enumerate(value)]

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, f"expected a boolean, got {type_name(value)}")
        return value

    def integer(self, value: Any, key: str) -> int:
        # bool is a subclass of int: ``max_body_bytes = true`` must not read as 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {type_name(value)}")
        return value

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {type_name(value)}")
        # TOML allows inf and nan; nan compares false with everything and would pass "> 0".
        if not math.isfinite(value):
            raise self.error(key, "expected a finite number, got inf or nan")
        return float(value)

    def interpolate(self, text: str, key: str) -> str:
        """Replace ``${NAME}`` from the environment and ``$$`` with ``$``, in one pass."""

        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name = match.group(1)
            if name is None:
                raise self.error(key, "a '$' must start ${NAME} or be doubled as '$$'")
            if name not in self.environ:
                raise self.error(key, f"environment variable {name} is not set")
            resolved = self.environ[name]
            if not resolved:
                raise self.error(key, f"environment variable {name} is empty")
            return resolved

        return _DOLLAR.sub(substitute, text)
