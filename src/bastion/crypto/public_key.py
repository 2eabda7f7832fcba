"""An Ed25519 public key that can verify the gateway's claims, and the base64url it is spelled in.

Part of the hazmat boundary (STYLE "crypto/"), split from ``keys.py`` so that
the published key set (``key_set.py``), which lists and checks public keys,
does not depend on the keyring that signs it. :class:`VerifyingKey` holds no
private key; the :class:`~bastion.crypto.keys.Keyring` that does imports it
from here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bastion.crypto.jcs import canonical_json

__all__ = ["KeyringError", "VerifyingKey", "b64url_decode", "b64url_encode"]

_B64URL_RE = re.compile(r"[A-Za-z0-9_-]*")


class KeyringError(Exception):
    """A key file or key material that cannot be used; the message names the file and the defect."""


def b64url_encode(data: bytes) -> str:
    """Unpadded base64url (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode unpadded base64url, accepting exactly one spelling of each byte string.

    Raises ``ValueError`` for padding, characters outside the alphabet, an
    impossible length, or non-zero unused bits (a second spelling of the same
    bytes), so that a changed character is never silently ignored.
    """
    if not isinstance(text, str) or not _B64URL_RE.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not unpadded base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:  # pragma: no cover - the regex and length check exclude it
        raise ValueError(f"not base64url: {exc}") from exc
    if b64url_encode(raw) != text:
        raise ValueError("not the canonical base64url spelling of its bytes")
    return raw


def _raw_public(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw)


class VerifyingKey:
    """An Ed25519 public key that can verify claims, and nothing else.

    Build it with :meth:`from_pem`, :meth:`from_jwk` or :meth:`load`; each
    raises :class:`KeyringError` for anything that is not an Ed25519 public key.
    """

    __slots__ = ("_key_id", "_public")

    def __init__(self, public: Ed25519PublicKey) -> None:
        self._public = public
        x = b64url_encode(_raw_public(public))
        # RFC 7638 section 3.2 (members per RFC 8037 section 2): crv, kty, x in
        # lexicographic order, no whitespace; JCS gives exactly those bytes.
        thumbprint_input = canonical_json({"crv": "Ed25519", "kty": "OKP", "x": x})
        self._key_id = b64url_encode(hashlib.sha256(thumbprint_input).digest())

    @property
    def key_id(self) -> str:
        """The RFC 7638 JWK thumbprint of this key."""
        return self._key_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyingKey) and other._key_id == self._key_id

    def __hash__(self) -> int:
        return hash(self._key_id)

    def __repr__(self) -> str:
        return f"VerifyingKey(key_id={self._key_id!r})"

    def to_pem(self) -> bytes:
        """SubjectPublicKeyInfo PEM."""
        return self._public.public_bytes(
            encoding=serialization.Encoding.PEM, format=serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def to_jwk(self) -> dict[str, str]:
        """The public JWK (RFC 8037 OKP), with ``kid`` set to the key id."""
        x = b64url_encode(_raw_public(self._public))
        return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": self._key_id}

    @classmethod
    def from_pem(cls, data: bytes) -> VerifyingKey:
        """A key from SubjectPublicKeyInfo PEM; raises :class:`KeyringError`."""
        try:
            public = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as exc:
            raise KeyringError(f"not a PEM public key: {exc}") from exc
        if not isinstance(public, Ed25519PublicKey):
            raise KeyringError(f"not an Ed25519 public key: {type(public).__name__}")
        return cls(public)

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any]) -> VerifyingKey:
        """A key from an OKP/Ed25519 JWK; raises :class:`KeyringError`.

        A ``kid`` or ``alg`` member, when present, must agree with the key
        (kid equal to its thumbprint, alg ``EdDSA``); private members are refused.
        """
        if not isinstance(jwk, Mapping):
            raise KeyringError("JWK is not a JSON object")
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            raise KeyringError(f"not an Ed25519 JWK: kty={jwk.get('kty')!r} crv={jwk.get('crv')!r}")
        if "d" in jwk:
            raise KeyringError("JWK carries private key material ('d'); refusing it")
        if "alg" in jwk and jwk["alg"] != "EdDSA":
            raise KeyringError(f"JWK alg {jwk['alg']!r} is not EdDSA")
        x = jwk.get("x")
        if not isinstance(x, str):
            raise KeyringError("JWK 'x' is missing or not a string")
        try:
            raw = b64url_decode(x)
            public = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as exc:
            raise KeyringError(f"JWK 'x' is not an Ed25519 public key: {exc}") from exc
        key = cls(public)
        if "kid" in jwk and jwk["kid"] != key.key_id:
            raise KeyringError(f"JWK kid {jwk['kid']!r} is not the key's thumbprint {key.key_id!r}")
        return key

    @classmethod
    def load(cls, data: bytes) -> VerifyingKey:
        """A key from a PEM file's bytes or a JWK JSON document's bytes; raises :class:`KeyringError`."""
        if data.lstrip().startswith(b"-----BEGIN"):
            return cls.from_pem(data)
        try:
            jwk = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise KeyringError("neither a PEM public key nor a JWK JSON document") from exc
        return cls.from_jwk(jwk)

    def _verify(self, signature: bytes, message: bytes) -> None:
        """Raise ``cryptography``'s ``InvalidSignature`` unless valid. Package-private: see ``sign.py``."""
        self._public.verify(signature, message)
