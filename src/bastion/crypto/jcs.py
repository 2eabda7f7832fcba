"""RFC 8785 canonical JSON, the one serialization that Bastion hashes or signs (DESIGN section 4).

:func:`canonical_json` is byte-identical to ``rfc8785.dumps`` for every input,
raising the same errors where RFC 8785 has no form for a value. It takes a fast
path through ``orjson`` for the plain shapes Bastion hashes all day (objects
with ASCII keys holding strings, booleans, ``null``, safe integers and nested
objects or arrays of the same), because ``orjson`` writes exactly the RFC 8785
bytes for those shapes: keys sorted by code point (identical to UTF-16 order for
ASCII keys), no whitespace, only ``"``, ``\\`` and control characters escaped,
short escapes for ``\\b \\f \\n \\r \\t`` and lowercase ``\\u00xx`` for the rest,
and every other character as raw UTF-8. Anything else (floats, integers past
2**53 - 1, non-ASCII keys, subclasses) goes to ``rfc8785`` itself. The property
tests in ``tests/unit/crypto/test_crypto_jcs.py`` hold the two paths equal.

This module never does I/O.
"""

from __future__ import annotations

from typing import Any

import orjson
import rfc8785

__all__ = ["MAX_SAFE_INTEGER", "CanonicalizationError", "canonical_json", "is_plain_json"]

#: RFC 8785 section 3.2.2.3: integers are IEEE 754 doubles; beyond this they lose precision.
MAX_SAFE_INTEGER = 2**53 - 1

CanonicalizationError = rfc8785.CanonicalizationError

_SORT = orjson.OPT_SORT_KEYS
# orjson refuses to write deeper nesting than this: such a value takes the rfc8785 path.
_MAX_PLAIN_DEPTH = 254


def is_plain_json(value: Any) -> bool:
    """Whether ``value`` is one of the shapes for which orjson's sorted output is RFC 8785.

    Exact types only: a ``str`` or ``int`` subclass (an enum, say) takes the
    slow path rather than trusting another library's notion of its value.
    """
    # One walk, scalars checked in place: this runs for every entry hashed, and a call per
    # value cost more than the check (issue 28). Past orjson's own depth a value is not plain.
    stack: list[tuple[Any, int]] = [([value], 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is dict:
            for key in item:
                if type(key) is not str or not key.isascii():
                    return False
            item = item.values()
        for child in item:
            kind = type(child)
            if kind is str or child is None or kind is bool:
                continue
            if kind is int:
                if -MAX_SAFE_INTEGER <= child <= MAX_SAFE_INTEGER:
                    continue
                return False
            if (kind is dict or kind is list) and depth < _MAX_PLAIN_DEPTH:
                stack.append((child, depth + 1))
                continue
            return False
    return True


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of ``value``.

    Raises :class:`CanonicalizationError` (``rfc8785``'s) for a value that has
    no canonical form: a non-finite float, an integer outside the safe range,
    or a string with a lone surrogate.
    """
    if is_plain_json(value):
        try:
            return orjson.dumps(value, option=_SORT)
        except orjson.JSONEncodeError:
            # A lone surrogate: let rfc8785 raise its own error for it.
            pass
    return rfc8785.dumps(value)
