"""The verifier's fast line reader (``audit/walk.py``): a line is read only when it is its RFC 8785 form."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import rfc8785
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bastion.audit import walk
from bastion.audit.errors import BundleDefect
from bastion.crypto.jcs import is_plain_json
from tests.unit.crypto.test_crypto_jcs import entry_shaped


def _fast_path_accepts(line: bytes) -> bool:
    try:
        entry = walk._decode_line(line)
    except msgspec.MsgspecError:
        return False
    return bool(entry.detail is None or is_plain_json(entry.detail)) and walk._encode_line(entry) == line


def _written(value: dict[str, Any], form: str) -> bytes:
    if form == "canonical":
        return rfc8785.dumps(value)
    if form == "ascii escapes":
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    if form == "spaced":
        return json.dumps(value, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if form == "unsorted":
        reordered = dict(reversed(list(value.items())))
        return json.dumps(reordered, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
    raise AssertionError(form)


# Entries whose required fields are strings (entry_shaped lets any text field be null).
_REQUIRED = ("ts", "session_id", "event", "prev", "hash")
entries = entry_shaped.flatmap(
    lambda value: st.fixed_dictionaries({name: st.text() for name in _REQUIRED}).map(
        lambda required: {**value, **required}
    )
)


@settings(max_examples=500)
@given(entries, st.sampled_from(["canonical", "ascii escapes", "spaced", "unsorted"]))
def test_the_fast_reader_accepts_exactly_the_rfc8785_line(value: dict[str, Any], form: str) -> None:
    """Every canonical entry line is read by the fast path; any other spelling of it never is."""
    try:
        reference = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeError):
        assume(False)
    line = _written(value, form)
    accepted = _fast_path_accepts(line)
    if accepted:
        assert line == reference
    if line == reference and (value["detail"] is None or is_plain_json(value["detail"])):
        assert accepted


def test_lines_the_fast_reader_refuses_still_get_their_precise_defect() -> None:
    """An unsorted, a mistyped and a non-JSON line each take the reference path and its message."""
    entry: dict[str, Any] = dict.fromkeys(walk._Line.__struct_fields__)
    entry.update(
        seq=0,
        prev="0" * 64,
        hash="0" * 64,
        session_id="s",
        event="session_open",
        ts="2026-12-01T00:00:00.000000Z",
    )
    canonical = rfc8785.dumps(entry)
    cases = {
        b"{" + canonical[canonical.index(b'"args_digest"') :],  # a missing field
        canonical.replace(b'"seq":0', b'"seq":"0"'),
        canonical.replace(b",", b", ", 1),
        b"not json",
    }
    defects = set()
    for line in cases:
        assert not _fast_path_accepts(line)
        with pytest.raises(BundleDefect) as raised:
            walk._read_strict(line, line=1, source=None)
        defects.add((type(raised.value).__name__, raised.value.detail.split(":")[0].split(" is ")[0]))
    assert defects == {
        ("MalformedEntry", "entry fields differ"),
        ("MalformedEntry", "seq"),
        ("NotCanonical", "line"),
        ("MalformedEntry", "not JSON"),
    }
    assert _fast_path_accepts(canonical)
