"""The execution binding (DESIGN section 3): SHA-256 hex of RFC 8785 JSON of {server, tool, arguments}."""

from __future__ import annotations

import hashlib

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.admission.binding import bind_call
from bastion.errors import InvalidParams


def test_known_vector() -> None:
    """The binding is SHA-256 over the canonical bytes, keys sorted, no whitespace, UTF-8."""
    canonical = '{"arguments":{"a":1,"b":[true,null,"é"],"c":1.5},"server":"git","tool":"push"}'
    expected = hashlib.sha256(canonical.encode()).hexdigest()
    assert bind_call("git", "push", {"c": 1.5, "b": [True, None, "é"], "a": 1})[0] == expected


def test_key_order_and_number_spelling_do_not_matter() -> None:
    """Equal JSON values bind equally, whatever the order of keys or the spelling of numbers."""
    one = bind_call("s", "t", {"x": {"p": 1, "q": 2}, "y": 10.0})[0]
    two = bind_call("s", "t", {"y": 10, "x": {"q": 2, "p": 1}})[0]
    assert one == two


@pytest.mark.parametrize(
    ("server", "tool", "arguments"),
    [
        ("s2", "t", {"x": 1}),
        ("s", "t2", {"x": 1}),
        ("s", "t", {"x": 2}),
        ("s", "t", {"x": "1"}),
        ("s", "t", {}),
    ],
)
def test_any_change_changes_the_binding(server: str, tool: str, arguments: dict[str, object]) -> None:
    """Server, tool and every argument value are bound."""
    assert bind_call(server, tool, arguments)[0] != bind_call("s", "t", {"x": 1})[0]


def test_fields_cannot_be_shifted_between_server_and_tool() -> None:
    """The structure is hashed, not a concatenation: ('ab', 'c') differs from ('a', 'bc')."""
    assert bind_call("ab", "c", {})[0] != bind_call("a", "bc", {})[0]


def test_absent_arguments_bind_as_empty_object() -> None:
    """MCP treats absent arguments as none: None and {} bind the same."""
    assert bind_call("s", "t", None)[0] == bind_call("s", "t", {})[0]


def test_binding_is_lowercase_sha256_hex() -> None:
    """64 lowercase hex digits, the form the store accepts."""
    value = bind_call("s", "t", {"k": "v"})[0]
    assert len(value) == 64 and value == value.lower() and int(value, 16) >= 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2**64, {1, 2}, b"bytes"])
def test_arguments_without_canonical_form_are_refused(bad: object) -> None:
    """A binding that cannot be computed admits nothing: InvalidParams naming the arguments, not the value."""
    with pytest.raises(InvalidParams) as caught:
        bind_call("s", "t", {"v": bad})[0]
    assert caught.value.data["field"] == "arguments"
    assert str(bad) not in str(caught.value)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_values = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4), max_leaves=12
)


@settings(max_examples=300, deadline=None)
@given(server=st.text(), tool=st.text(), arguments=st.dictionaries(st.text(), _values, max_size=5))
def test_bind_call_equals_the_canonical_form_of_the_whole_document(
    server: str, tool: str, arguments: dict[str, object]
) -> None:
    """bind_call spells the document around the arguments' canonical form: equal to RFC 8785 of it."""
    document = {"server": server, "tool": tool, "arguments": arguments}
    binding, digest = bind_call(server, tool, arguments)
    assert binding == hashlib.sha256(rfc8785.dumps(document)).hexdigest()
    assert digest == "sha256:" + hashlib.sha256(rfc8785.dumps(arguments)).hexdigest()


def test_bind_call_refuses_arguments_without_a_canonical_form() -> None:
    """A NaN in the arguments is refused as invalid params, naming no value."""
    with pytest.raises(InvalidParams):
        bind_call("s", "t", {"x": float("nan")})
