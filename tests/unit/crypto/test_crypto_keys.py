"""The keyring: 0600 key files, RFC 7638 key ids, rotation that keeps old public keys."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from agentrust_trace import jwk_thumbprint

from bastion.crypto.jcs import canonical_json
from bastion.crypto.keys import Keyring, KeyringError, UnknownKeyId, VerifyingKey, b64url_decode
from bastion.crypto.sign import sign_claim, verify_claim


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_first_use_creates_a_0600_key_in_a_0700_dir(tmp_path: Path) -> None:
    """Opening an empty data dir creates the signing key with mode 0600 under a 0700 directory."""
    keyring = Keyring.open(tmp_path / "data")
    key_file = tmp_path / "data" / "keys" / "signing.pem"
    assert _mode(key_file) == 0o600
    assert _mode(tmp_path / "data" / "keys") == 0o700
    assert (tmp_path / "data" / "keys" / "public" / f"{keyring.key_id}.pem").exists()
    assert list((tmp_path / "data" / "keys").glob(".*.tmp")) == []


def test_key_file_is_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    """The key file mode does not depend on the process umask."""
    old = os.umask(0)
    try:
        Keyring.open(tmp_path)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "keys" / "signing.pem") == 0o600


def test_reopening_loads_the_same_key(tmp_path: Path) -> None:
    """A second open of the same data dir signs with the same key id."""
    assert Keyring.open(tmp_path).key_id == Keyring.open(tmp_path).key_id


def test_key_id_is_the_rfc7638_thumbprint(tmp_path: Path) -> None:
    """The key id equals the RFC 7638 JWK thumbprint an independent implementation computes."""
    keyring = Keyring.open(tmp_path)
    jwk = keyring.active.to_jwk()
    assert keyring.key_id == jwk_thumbprint(jwk) == jwk["kid"]
    assert len(b64url_decode(keyring.key_id)) == 32


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_key_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    """A signing key file readable or writable by group or others is refused, not used."""
    Keyring.open(tmp_path)
    (tmp_path / "keys" / "signing.pem").chmod(mode)
    with pytest.raises(KeyringError, match="0600"):
        Keyring.open(tmp_path)


def test_a_key_dir_writable_by_others_is_refused(tmp_path: Path) -> None:
    """A key directory that group or others can write is refused: they could swap the key."""
    Keyring.open(tmp_path)
    (tmp_path / "keys").chmod(0o777)
    with pytest.raises(KeyringError, match="group/other-writable"):
        Keyring.open(tmp_path)


def test_a_symlinked_key_is_refused(tmp_path: Path) -> None:
    """The signing key must be a regular file, not a symlink to one."""
    Keyring.open(tmp_path / "a")
    keys = tmp_path / "b" / "keys"
    keys.mkdir(parents=True)
    (keys / "signing.pem").symlink_to(tmp_path / "a" / "keys" / "signing.pem")
    with pytest.raises(KeyringError, match="regular file"):
        Keyring.open(tmp_path / "b")


def test_a_corrupt_key_is_refused(tmp_path: Path) -> None:
    """A signing key file that is not a PEM private key is refused."""
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "signing.pem").write_bytes(b"not a key")
    (keys / "signing.pem").chmod(0o600)
    with pytest.raises(KeyringError, match="not a PEM private key"):
        Keyring.open(tmp_path)


def test_rotation_keeps_old_public_keys_so_old_claims_verify(tmp_path: Path) -> None:
    """After rotation the new key signs, and claims signed by the old key still verify with its kept key."""
    keyring = Keyring.open(tmp_path)
    old_id = keyring.key_id
    old_claim = sign_claim({"n": 1}, keyring)
    new_id = keyring.rotate()
    assert new_id != old_id and keyring.key_id == new_id
    assert _mode(tmp_path / "keys" / "signing.pem") == 0o600
    reopened = Keyring.open(tmp_path)
    assert reopened.key_id == new_id
    verify_claim(old_claim, reopened.verifying_key(old_id))
    verify_claim(
        old_claim, VerifyingKey.from_pem((tmp_path / "keys" / "public" / f"{old_id}.pem").read_bytes())
    )
    assert {key.key_id for key in reopened.verifying_keys()} == {old_id, new_id}
    verify_claim(sign_claim({"n": 2}, reopened), reopened.verifying_key(new_id))


def test_unknown_key_ids_are_refused(tmp_path: Path) -> None:
    """Asking for a key id that was never used raises UnknownKeyId, also for path-like ids."""
    keyring = Keyring.open(tmp_path)
    with pytest.raises(UnknownKeyId):
        keyring.verifying_key("A" * 43)
    with pytest.raises(UnknownKeyId):
        keyring.verifying_key("../keys/signing")


def test_public_key_exports_round_trip_as_pem_and_jwk(tmp_path: Path) -> None:
    """The PEM and the JWK export load back to the same key, and load() tells them apart."""
    key = Keyring.open(tmp_path).active
    assert VerifyingKey.from_pem(key.to_pem()) == key
    assert VerifyingKey.from_jwk(key.to_jwk()) == key
    assert VerifyingKey.load(key.to_pem()) == key
    assert VerifyingKey.load(canonical_json(key.to_jwk())) == key
    assert key.to_jwk().keys() == {"kty", "crv", "x", "kid"}


@pytest.mark.parametrize(
    "change",
    [
        {"kid": "A" * 43},
        {"alg": "ES256"},
        {"d": "AAAA"},
        {"crv": "X25519"},
        {"x": "not base64!"},
        {"x": "AAAA"},
    ],
)
def test_bad_jwks_are_refused(tmp_path: Path, change: dict[str, str]) -> None:
    """A JWK with a wrong kid or alg, private material, another curve or bad x is refused."""
    jwk = {**Keyring.open(tmp_path).active.to_jwk(), **change}
    with pytest.raises(KeyringError):
        VerifyingKey.from_jwk(jwk)


@pytest.mark.parametrize(
    "data", [b"", b"{}", b"[1]", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"]
)
def test_garbage_is_not_a_key(data: bytes) -> None:
    """Bytes that are neither a PEM public key nor an Ed25519 JWK raise KeyringError."""
    with pytest.raises(KeyringError):
        VerifyingKey.load(data)


@pytest.mark.parametrize("text", ["AA==", "A", "AB", "A+/A", "A b"])
def test_b64url_decode_accepts_one_spelling_only(text: str) -> None:
    """Padding, other alphabets, impossible lengths and non-zero spare bits are refused."""
    with pytest.raises(ValueError):
        b64url_decode(text)
