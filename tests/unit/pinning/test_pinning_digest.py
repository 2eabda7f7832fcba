"""The pinned form and its digest (issue 27): SHA-256 of the RFC 8785 bytes, bounded."""

from __future__ import annotations

import hashlib

import pytest
import rfc8785

from bastion.pinning.digest import MAX_DEFINITION_BYTES, DefinitionUnpinnable, definition_digest, pinned_form
from bastion.store.pins import PinKind

TOOL = {
    "name": "notes__echo",
    "description": "Echo the text. é",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "annotations": {"readOnlyHint": True},
    "_meta": {"not": "pinned"},
    "icons": [],
}


def test_the_digest_is_sha256_of_the_rfc8785_form_with_the_upstream_name() -> None:
    """Only the pinned fields count, named as the upstream names the tool; the digest is RFC 8785's."""
    form = pinned_form(PinKind.TOOL, TOOL, "echo")
    assert form == {k: v for k, v in TOOL.items() if k not in ("_meta", "icons")} | {"name": "echo"}
    assert definition_digest(form) == hashlib.sha256(rfc8785.dumps(form)).hexdigest()


def test_key_order_and_unpinned_fields_do_not_change_the_digest() -> None:
    """The same definition with its keys reordered, or another ``_meta``, has the same digest."""
    shuffled = dict(reversed(list(TOOL.items()))) | {"_meta": {"other": 1}}
    assert definition_digest(pinned_form(PinKind.TOOL, shuffled, "echo")) == definition_digest(
        pinned_form(PinKind.TOOL, TOOL, "echo")
    )


def test_a_changed_description_changes_the_digest() -> None:
    """One character of the description is a different pin."""
    changed = TOOL | {"description": "Echo the text! é"}
    assert definition_digest(pinned_form(PinKind.TOOL, changed, "echo")) != definition_digest(
        pinned_form(PinKind.TOOL, TOOL, "echo")
    )


def test_an_oversized_definition_is_never_pinned() -> None:
    """A definition past the bound is refused, not truncated."""
    huge = TOOL | {"description": "x" * MAX_DEFINITION_BYTES}
    with pytest.raises(DefinitionUnpinnable):
        definition_digest(pinned_form(PinKind.TOOL, huge, "echo"))
