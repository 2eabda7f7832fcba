"""The params._cmcp envelope (seed 000): validated ids, refused unknowns, stripped before the upstream."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bastion.admission.envelope import CmcpEnvelope, read_envelope
from bastion.errors import InvalidCmcpEnvelope

VISIBLE_ASCII = "".join(chr(c) for c in range(0x21, 0x7F))


def test_absent_envelope_reads_as_nulls() -> None:
    """Missing _cmcp is legal: both ids None, params returned as a new equal dict."""
    params = {"name": "t", "arguments": {"a": 1}}
    envelope, stripped = read_envelope(params)
    assert envelope == CmcpEnvelope(None, None)
    assert stripped == params and stripped is not params


def test_ids_are_read_and_envelope_stripped_without_mutating_input() -> None:
    """Both ids are returned; the new params lack _cmcp; the input is untouched."""
    params = {
        "name": "t",
        "arguments": {"_cmcp": "an argument, not the envelope"},
        "_meta": {"progressToken": 1},
        "_cmcp": {"execution_id": "exec-1", "workflow_id": "wf-9"},
    }
    before = copy.deepcopy(params)
    envelope, stripped = read_envelope(params)
    assert envelope == CmcpEnvelope("exec-1", "wf-9")  # type: ignore[arg-type]
    assert stripped == {k: v for k, v in before.items() if k != "_cmcp"}
    assert params == before


@pytest.mark.parametrize("present", ["execution_id", "workflow_id"])
def test_either_id_alone_is_legal(present: str) -> None:
    """The two ids are independent: either may come without the other."""
    envelope, _ = read_envelope({"_cmcp": {present: "x"}})
    assert getattr(envelope, present) == "x"
    other = "workflow_id" if present == "execution_id" else "execution_id"
    assert getattr(envelope, other) is None


def test_empty_envelope_object_is_legal() -> None:
    """An empty _cmcp object carries nothing and is stripped."""
    envelope, stripped = read_envelope({"name": "t", "_cmcp": {}})
    assert envelope == CmcpEnvelope() and stripped == {"name": "t"}


@pytest.mark.parametrize("value", ["a", "x" * 128, VISIBLE_ASCII, "exec:2026/05/01#1"])
@pytest.mark.parametrize("key", ["execution_id", "workflow_id"])
def test_valid_ids(key: str, value: str) -> None:
    """1..128 visible ASCII characters are accepted as given."""
    envelope, _ = read_envelope({"_cmcp": {key: value}})
    assert getattr(envelope, key) == value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "empty"),
        ("x" * 129, "too_long"),
        ("has space", "invalid_character"),
        ("tab\t", "invalid_character"),
        ("new\nline", "invalid_character"),
        ("del\x7f", "invalid_character"),
        ("é", "invalid_character"),
        ("null\x00", "invalid_character"),
        (None, "not_a_string"),
        (7, "not_a_string"),
        (["a"], "not_a_string"),
        ({"id": "a"}, "not_a_string"),
        (True, "not_a_string"),
    ],
)
@pytest.mark.parametrize("key", ["execution_id", "workflow_id"])
def test_invalid_ids_are_refused_naming_the_field(key: str, value: Any, problem: str) -> None:
    """Anything but 1..128 visible ASCII is refused with data naming the field and the problem."""
    with pytest.raises(InvalidCmcpEnvelope) as caught:
        read_envelope({"_cmcp": {key: value}})
    assert caught.value.data == {"field": f"_cmcp.{key}", "problem": problem}


@pytest.mark.parametrize("raw", ["exec-1", ["exec-1"], None, 1])
def test_envelope_must_be_an_object(raw: Any) -> None:
    """A _cmcp that is not a JSON object is refused."""
    with pytest.raises(InvalidCmcpEnvelope) as caught:
        read_envelope({"_cmcp": raw})
    assert caught.value.data == {"field": "_cmcp", "problem": "not_an_object"}


@pytest.mark.parametrize("key", ["executionId", "execution_id ", "idempotency_key", ""])
def test_unknown_keys_are_refused_without_echo(key: str) -> None:
    """An unknown key (perhaps a misspelt execution_id) is refused, and its name is not echoed."""
    with pytest.raises(InvalidCmcpEnvelope) as caught:
        read_envelope({"_cmcp": {"execution_id": "e", key: "v"}})
    assert caught.value.data == {"field": "_cmcp", "problem": "unknown_key"}
