"""Whether a decoded JSON value can cross the gateway (issue #12, DESIGN section 9).

Python's ``json`` reads more than JSON: ``NaN`` and ``Infinity``, lone
surrogates (``"\\ud800"``), and nesting deep enough to exhaust the stack of
whoever walks the value next (the binding, the audit digest, the encoder).
None of them can be hashed (RFC 8785), written as UTF-8, or relayed. A client's
request carrying one is refused before dispatch; an upstream's result carrying
one ends the call as an upstream error, never as an HTTP 500.

:func:`wire_problem` walks the value once, without recursion, and names the
first defect; it never echoes the offending value. :func:`loads_exact` reads
JSON text as ``json.loads`` does, through ``orjson`` where the two agree. This
module is pure.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

__all__ = ["MAX_DEPTH", "loads_exact", "wire_problem"]

#: Deepest nesting of objects and arrays accepted in a request or a result: far beyond any
#: tool's schema, far below the depth at which a recursive walker exhausts the stack.
MAX_DEPTH = 100


# 19 digits in a row: maybe an integer outside orjson's exact range (i64 and u64), which it would
# silently read as a float. Such a text (a false positive is only slower) takes the stdlib path.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_TEXT = re.compile(r"[0-9]{19}")


def loads_exact(data: bytes | str) -> Any:
    """The JSON value of ``data``, read exactly as ``json.loads`` reads it.

    orjson reads the common text; whatever it refuses (NaN, a lone surrogate, a BOM, nesting
    past its limit) or might read inexactly (a 19-digit integer) goes to ``json.loads``, so the
    value never depends on the parser and :func:`wire_problem` still names its defects.

    Raises:
        ValueError: ``data`` is not JSON.
        RecursionError: nesting too deep for ``json.loads``.
    """
    long_digits = _LONG_DIGITS.search(data) if isinstance(data, bytes) else _LONG_DIGITS_TEXT.search(data)
    if long_digits is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def wire_problem(value: Any, *, max_depth: int = MAX_DEPTH) -> str | None:
    """The first defect of ``value`` (``"not_finite"``, ``"lone_surrogate"``, ``"too_deep"``), or ``None``."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str:
            if not _encodable(item):
                return "lone_surrogate"
        elif kind is float:
            if not math.isfinite(item):
                return "not_finite"
        elif kind is dict or kind is list:
            if depth >= max_depth:
                return "too_deep"
            # A child that cannot be a defect (an ASCII string, an int, a bool, null) is not
            # pushed: the walk visits the rest in the same order, so the first defect is the same.
            if kind is dict:
                for key, child in item.items():
                    if isinstance(key, str) and not key.isascii() and not _encodable(key):
                        return "lone_surrogate"
                    ck = type(child)
                    if not ((ck is str and child.isascii()) or ck is int or ck is bool or child is None):
                        stack.append((child, depth + 1))
            else:
                for child in item:
                    ck = type(child)
                    if not ((ck is str and child.isascii()) or ck is int or ck is bool or child is None):
                        stack.append((child, depth + 1))
    return None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
