"""sign_claim and verify_claim: Ed25519 over RFC 8785, verify raises and never returns a bool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bastion.crypto.keys import Keyring
from bastion.crypto.sign import InvalidClaimSignature, sign_claim, verify_claim


@pytest.fixture
def keyring(tmp_path: Path) -> Keyring:
    return Keyring.open(tmp_path)


def test_a_signed_claim_verifies_and_names_its_key(keyring: Keyring) -> None:
    """The signed claim carries cnf.jwk with the key id and verifies under that key."""
    claim = sign_claim({"subject": "x", "n": 1}, keyring)
    assert claim["cnf"]["jwk"]["kid"] == keyring.key_id
    assert verify_claim(claim, keyring.active) is None


@pytest.mark.parametrize(
    "tamper",
    [
        lambda c: {**c, "n": 2},
        lambda c: {**c, "extra": True},
        lambda c: {k: v for k, v in c.items() if k != "n"},
        lambda c: {**c, "signature": c["signature"][:-2] + ("AA" if c["signature"][-2:] != "AA" else "QQ")},
        lambda c: {**c, "signature": c["signature"] + "="},
        lambda c: {k: v for k, v in c.items() if k != "signature"},
        lambda c: {**c, "signature": 5},
        lambda c: {**c, "cnf": {}},
    ],
)
def test_any_change_is_refused(keyring: Keyring, tamper: Any) -> None:
    """A changed, added or removed member, or a mangled signature, raises InvalidClaimSignature."""
    claim = sign_claim({"subject": "x", "n": 1}, keyring)
    with pytest.raises(InvalidClaimSignature):
        verify_claim(tamper(claim), keyring.active)


def test_another_key_is_refused(keyring: Keyring, tmp_path: Path) -> None:
    """A claim verifies only under the key that signed it."""
    other = Keyring.open(tmp_path / "other")
    claim = sign_claim({"n": 1}, other)
    with pytest.raises(InvalidClaimSignature, match="not by the trusted key"):
        verify_claim(claim, keyring.active)


def test_a_trusted_signature_cannot_name_another_confirmation_key(keyring: Keyring, tmp_path: Path) -> None:
    """A claim whose cnf.jwk names another key is refused even if the trusted key signed the bytes."""
    other = Keyring.open(tmp_path / "other")
    claim = sign_claim({"n": 1}, keyring)
    swapped = {**claim, "cnf": {"jwk": other.active.to_jwk()}}
    with pytest.raises(InvalidClaimSignature):
        verify_claim(swapped, keyring.active)


def test_signing_twice_is_refused(keyring: Keyring) -> None:
    """A claim that already carries a signature is not signed again."""
    with pytest.raises(ValueError, match="already signed"):
        sign_claim(sign_claim({"n": 1}, keyring), keyring)
