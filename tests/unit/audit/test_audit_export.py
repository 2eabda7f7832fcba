"""Bundles and claim files are written in their one exact form."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from bastion.audit.entry import GENESIS_PREV
from bastion.audit.export import claim_bytes, entry_line, write_bundle, write_bundle_file, write_claim_file
from bastion.crypto.keys import Keyring


def test_each_line_is_the_rfc8785_form_of_the_entry(keyring: Keyring, make_chain: Any) -> None:
    """A bundle line is rfc8785's bytes for every field of the entry, then a newline."""
    entries = make_chain(keyring.key_id)
    out = io.BytesIO()
    assert write_bundle(entries, out) == len(entries)
    lines = out.getvalue().split(b"\n")
    assert lines[-1] == b""
    assert lines[:-1] == [rfc8785.dumps(entry.to_json()) for entry in entries]


def test_a_broken_chain_is_not_exported(keyring: Keyring, make_chain: Any) -> None:
    """Entries out of order, from the middle, or unsealed are refused before they are written."""
    entries = make_chain(keyring.key_id)
    for bad in (
        [entries[1]],
        [entries[0], entries[2]],
        [entries[0], entries[1].__class__(**{**entries[1].to_json(), "hash": None})],
    ):
        with pytest.raises(ValueError):
            write_bundle(bad, io.BytesIO())
    assert entries[0].prev == GENESIS_PREV
    with pytest.raises(ValueError, match="not sealed"):
        entry_line(entries[0].__class__(**{**entries[0].to_json(), "hash": None}))


def test_files_are_new_and_claims_signed(tmp_path: Path, keyring: Keyring, make_chain: Any) -> None:
    """Bundle and claim files refuse to overwrite, and an unsigned claim is refused."""
    entries = make_chain(keyring.key_id)
    write_bundle_file(entries, tmp_path / "b.jsonl")
    with pytest.raises(FileExistsError):
        write_bundle_file(entries, tmp_path / "b.jsonl")
    with pytest.raises(ValueError, match="not signed"):
        claim_bytes({"a": 1})
    write_claim_file({"b": 1, "signature": "x"}, tmp_path / "c.json")
    assert (tmp_path / "c.json").read_bytes() == b'{"b":1,"signature":"x"}\n'
