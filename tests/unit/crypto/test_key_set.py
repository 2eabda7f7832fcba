"""The published key set (issue #11 point 15): signed by the active key; at rotation by old and new."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bastion.cli.main import main
from bastion.crypto.key_set import InvalidKeySet, verify_key_set
from bastion.crypto.keys import Keyring


def test_a_new_keyring_publishes_its_key_signed_by_itself(tmp_path: Path) -> None:
    """The first key set lists the active key only, signed by it, and verifies with it pinned."""
    keyring = Keyring.open(tmp_path)
    document = keyring.key_set()
    assert document["active"] == keyring.key_id
    assert [jwk["kid"] for jwk in document["keys"]] == [keyring.key_id]
    assert document["keys"][0]["status"] == "active"
    assert verify_key_set(document, keyring.active) == [keyring.active]
    assert Keyring.open(tmp_path).key_set() == document  # reopening does not re-sign


def test_rotation_is_endorsed_by_the_previous_key(tmp_path: Path) -> None:
    """After rotation the set lists both keys and verifies with either pinned, never with a stranger's key."""
    keyring = Keyring.open(tmp_path)
    old = keyring.active
    new_id = keyring.rotate()
    document = keyring.key_set()
    assert document["active"] == new_id
    assert {jwk["kid"]: jwk["status"] for jwk in document["keys"]} == {
        old.key_id: "retired",
        new_id: "active",
    }
    assert {s["kid"] for s in document["signatures"]} == {old.key_id, new_id}
    assert {k.key_id for k in verify_key_set(document, old)} == {old.key_id, new_id}
    assert {k.key_id for k in verify_key_set(document, keyring.active)} == {old.key_id, new_id}
    with pytest.raises(InvalidKeySet, match="not signed by the pinned key"):
        verify_key_set(document, Keyring.open(tmp_path / "stranger").active)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(
            active=d["keys"][0]["kid"] if d["keys"][0]["kid"] != d["active"] else d["keys"][1]["kid"]
        ),
        lambda d: d["keys"].pop(),
        lambda d: d.update(issued_at=d["issued_at"] + 1),
        lambda d: d.update(extra=True),
    ],
    ids=["active-swapped", "key-dropped", "issued-at", "extra-member"],
)
def test_a_changed_key_set_does_not_verify(tmp_path: Path, tamper: Any) -> None:
    """Any change to a signed key set makes it fail against the pinned key."""
    keyring = Keyring.open(tmp_path)
    old = keyring.active
    keyring.rotate()
    document = keyring.key_set()
    tamper(document)
    with pytest.raises(InvalidKeySet):
        verify_key_set(document, old)


def test_verify_keys_cli_follows_a_rotation_from_the_pinned_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bastion verify-keys` (the real entry point) vouches for the new key from the old pin."""
    data = tmp_path / "data"
    assert main(["public-key", "--data-dir", str(data)]) == 2  # no key yet: nothing created
    keyring = Keyring.open(data)
    pinned = tmp_path / "pinned.pem"
    pinned.write_bytes(keyring.active.to_pem())
    assert main(["rotate-key", "--data-dir", str(data)]) == 0
    new_id = Keyring.open(data).key_id
    capsys.readouterr()
    document = data / "keys" / "bastion-keys.json"
    out = tmp_path / "keys"
    assert main(["verify-keys", str(document), "--key", str(pinned), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("OK ") and f"{new_id}  active" in printed
    assert (out / f"{new_id}.pem").read_bytes() == Keyring.open(data).active.to_pem()
    stranger = tmp_path / "stranger.pem"
    stranger.write_bytes(Keyring.open(tmp_path / "other").active.to_pem())
    assert main(["verify-keys", str(document), "--key", str(stranger)]) == 1
    assert "not signed by the pinned key" in capsys.readouterr().out
