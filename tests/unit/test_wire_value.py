"""Which decoded JSON values can cross the gateway (``wire_value.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.wire_value import MAX_DEPTH, loads_exact, wire_problem


def _nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, "ok", None, True, 2.5, {"é": "ü"}]}, None),
        (float("nan"), "not_finite"),
        ({"a": [float("inf")]}, "not_finite"),
        ("\ud800", "lone_surrogate"),
        ({"\udc00": 1}, "lone_surrogate"),
        (_nested(MAX_DEPTH), None),
        (_nested(MAX_DEPTH + 1), "too_deep"),
        (_nested(100_000), "too_deep"),
    ],
)
def test_wire_problem_names_the_first_defect(value: Any, problem: str | None) -> None:
    """NaN/Infinity, lone surrogates and nesting past MAX_DEPTH are named; plain JSON passes."""
    assert wire_problem(value) == problem


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, "ok", null, true, 2.5, {"\\u00e9": "\\u00fc"}]}',
        '{"big": 123456789012345678901234567890, "neg": -9223372036854775809}',
        '{"exact": 18446744073709551616, "f": 0.1}',
        "[NaN, Infinity, -Infinity]",
        '"\\ud800"',
        '{"dup": 1, "dup": 2}',
        "\ufeff{}",
    ],
)
def test_loads_exact_reads_text_and_bytes_as_json_loads_does(text: str) -> None:
    """orjson's fast path never changes a value: long integers, NaN and lone surrogates read as json does."""
    for data in (text, text.encode("utf-8", "surrogatepass")):
        try:
            expected = json.loads(data)
        except ValueError:  # a BOM in text (not in bytes): refused by both
            with pytest.raises(ValueError):
                loads_exact(data)
            continue
        value = loads_exact(data)
        assert repr(value) == repr(expected)
        assert wire_problem(value) == wire_problem(expected)


@pytest.mark.parametrize("data", [b"", b"{", "[1,", b"\xff", "{'a': 1}"])
def test_loads_exact_refuses_what_is_not_json(data: bytes | str) -> None:
    """Text that is not JSON raises ValueError, as json.loads does."""
    with pytest.raises(ValueError):
        loads_exact(data)


def _every_child_walk(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """The walk ``wire_problem`` made before it skipped plain children: every child pushed."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is str:
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return "lone_surrogate"
        elif type(item) is float:
            if item != item or item in (float("inf"), float("-inf")):
                return "not_finite"
        elif type(item) in (dict, list):
            if depth >= max_depth:
                return "too_deep"
            if type(item) is dict:
                for key in item:
                    try:
                        key.encode("utf-8")
                    except UnicodeEncodeError:
                        return "lone_surrogate"
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return None


_scalars = st.sampled_from([None, True, 7, 2**70, 2.5, float("nan"), float("-inf"), "ascii", "é", "\ud800"])
_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(["a", "b", "ü", "\ud800"]), children, max_size=4),
    ),
    max_leaves=30,
)


@settings(max_examples=400)
@given(_values, st.integers(min_value=1, max_value=4))
def test_wire_problem_names_the_defect_the_full_walk_names(value: Any, max_depth: int) -> None:
    """With several defects in one value, the one named is the one a walk over every child names."""
    assert wire_problem(value, max_depth=max_depth) == _every_child_walk(value, max_depth)
