"""canonical_json is byte-identical to the rfc8785 reference for every input."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.audit.entry import ENTRY_FIELDS
from bastion.crypto.jcs import MAX_SAFE_INTEGER, CanonicalizationError, canonical_json, is_plain_json

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)
_plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.text()
)
_detail = st.none() | st.dictionaries(
    st.text(),
    st.recursive(
        _plain_scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3),
        max_leaves=8,
    ),
    max_size=5,
)
_opt_text = st.none() | st.text()
entry_shaped = st.fixed_dictionaries(
    {
        name: (
            st.integers(min_value=0, max_value=MAX_SAFE_INTEGER)
            if name == "seq"
            else st.none() | st.integers(min_value=0, max_value=MAX_SAFE_INTEGER)
            if name == "epoch"
            else _detail
            if name == "detail"
            else _opt_text
        )
        for name in ENTRY_FIELDS
    }
)


def _reference(value: Any) -> bytes | type[Exception]:
    try:
        return rfc8785.dumps(value)
    except (CanonicalizationError, UnicodeError) as exc:
        return type(exc)


def _ours(value: Any) -> bytes | type[Exception]:
    try:
        return canonical_json(value)
    except (CanonicalizationError, UnicodeError) as exc:
        return type(exc)


@settings(max_examples=500)
@given(json_values)
def test_canonical_json_matches_rfc8785_on_any_json(value: Any) -> None:
    """Any JSON value (floats, big integers, any Unicode keys) canonicalizes exactly as rfc8785 does."""
    assert _ours(value) == _reference(value)


@settings(max_examples=500)
@given(entry_shaped)
def test_fast_path_matches_rfc8785_on_entry_shapes(value: dict[str, Any]) -> None:
    """Entry-shaped objects with arbitrary Unicode take the orjson path and give the RFC 8785 bytes."""
    assert _ours(value) == _reference(value)


def test_plain_shapes_take_the_fast_path_and_others_do_not() -> None:
    """Floats, unsafe integers, non-ASCII keys and subclasses are not plain; ASCII-keyed scalars are."""
    assert is_plain_json({"a": [1, "x", None, True, {"b": -MAX_SAFE_INTEGER}]})
    assert not is_plain_json({"a": 1.5})
    assert not is_plain_json({"a": MAX_SAFE_INTEGER + 1})
    assert not is_plain_json({"é": 1})
    assert not is_plain_json(("tuple",))


@pytest.mark.parametrize("value", ["\udc00", {"k": "\ud800x"}, 2**53, float("nan")])
def test_values_without_canonical_form_raise_like_rfc8785(value: Any) -> None:
    """A lone surrogate, an unsafe integer or NaN has no RFC 8785 form, on either path."""
    with pytest.raises(CanonicalizationError):
        canonical_json(value)


def test_supplementary_keys_sort_by_utf16_code_units() -> None:
    """U+1F600 sorts before U+E000 in UTF-16 order, which orjson alone would get wrong."""
    assert canonical_json({"\ue000": 1, "\U0001f600": 2}) == rfc8785.dumps({"\ue000": 1, "\U0001f600": 2})
    assert canonical_json({"\ue000": 1, "\U0001f600": 2}).startswith('{"\U0001f600"'.encode())


def _plain_by_recursion(value: Any) -> bool:
    """The definition ``is_plain_json`` had as a recursive function, before its one walk."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return True
    if kind is int:
        return bool(-MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if kind is dict:
        return all(type(k) is str and k.isascii() and _plain_by_recursion(v) for k, v in value.items())
    if kind is list:
        return all(_plain_by_recursion(item) for item in value)
    return False


@settings(max_examples=500)
@given(json_values | entry_shaped)
def test_is_plain_json_is_the_recursive_definition(value: Any) -> None:
    """The one walk answers as the recursive definition does, for any JSON value or entry shape."""
    assert is_plain_json(value) == _plain_by_recursion(value)


def _nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize(("depth", "plain"), [(254, True), (255, False), (2000, False)])
def test_nesting_past_orjsons_depth_takes_the_reference_path(depth: int, plain: bool) -> None:
    """Nesting orjson cannot write is not plain; where rfc8785 can write it, the bytes are its."""
    value = _nested(depth)
    assert is_plain_json(value) is plain
    if depth < 900:
        assert canonical_json(value) == rfc8785.dumps(value)
