"""Which decoded JSON values can cross the gateway (``wire_value.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.wire_value import MAX_DEPTH, wire_problem


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
