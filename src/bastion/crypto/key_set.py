"""The published key set: every key a gateway signs claims with, for verifiers to pin (issue #11 point 15).

A claim embeds its public key (``cnf.jwk``, with ``kid``), and a verifier that
trusts that embedded key trusts whoever re-signed the claim (``trace-tests``
Level 0 does). A verifier must pin the gateway's key instead, and follow its
rotations. This document, served at ``/.well-known/bastion-keys.json`` and
kept at ``<data_dir>/keys/bastion-keys.json``, lets it do so::

    {"type": "bastion-keys/v1", "active": <kid>, "issued_at": <unix seconds>,
     "keys": [<public JWK with kid and "status": "active" | "retired">, ...],
     "signatures": [{"kid": <signer kid>, "signature": <base64url Ed25519>}, ...]}

``keys`` is sorted by ``kid``. Each signature is over the RFC 8785 bytes of the
document without ``signatures``. The document is re-signed at every rotation
by the new key *and* the previous one (whose private half is discarded right
after), so a verifier who pinned the previous key can check that it endorsed
its successor: :func:`verify_key_set` accepts a document only if the pinned
key is listed and its signature verifies, and returns the keys it vouches for.

This module is part of the hazmat layer: only :class:`~bastion.crypto.keys.Keyring`
signs with it. It does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion.crypto.jcs import CanonicalizationError, canonical_json
from bastion.crypto.public_key import KeyringError, VerifyingKey, b64url_decode, b64url_encode

__all__ = ["KEY_SET_TYPE", "InvalidKeySet", "key_set_body", "sign_key_set", "verify_key_set"]

KEY_SET_TYPE: Final = "bastion-keys/v1"
_FIELDS = frozenset({"type", "active", "issued_at", "keys", "signatures"})


class InvalidKeySet(Exception):
    """The key set is malformed, not signed by the pinned key, or its signature does not verify."""


def key_set_body(keys: Sequence[VerifyingKey], active: VerifyingKey, *, issued_at: int) -> dict[str, Any]:
    """The unsigned document listing ``keys`` (``active`` among them)."""
    listed = {key.key_id: key for key in (*keys, active)}
    return {
        "type": KEY_SET_TYPE,
        "active": active.key_id,
        "issued_at": issued_at,
        "keys": [
            {**listed[kid].to_jwk(), "status": "active" if kid == active.key_id else "retired"}
            for kid in sorted(listed)
        ],
    }


def sign_key_set(body: Mapping[str, Any], signers: Sequence[Ed25519PrivateKey]) -> dict[str, Any]:
    """``body`` with one signature per signer (each must be a listed key)."""
    message = canonical_json(dict(body))
    listed = {jwk["kid"] for jwk in body["keys"]}
    signatures = []
    for private in signers:
        kid = VerifyingKey(private.public_key()).key_id
        if kid not in listed:
            raise ValueError(f"signer {kid} is not listed in the key set")
        signatures.append({"kid": kid, "signature": b64url_encode(private.sign(message))})
    return {**body, "signatures": signatures}


def verify_key_set(document: Mapping[str, Any], pinned: VerifyingKey) -> list[VerifyingKey]:
    """The keys ``document`` lists, once the pinned key's signature over it verifies.

    Raises :class:`InvalidKeySet`. Steps: (1) the shape; (2) the pinned key is
    listed and has signed; (3) that signature verifies over the RFC 8785 bytes
    of the document without ``signatures``; (4) every listed JWK is an Ed25519
    key whose ``kid`` is its thumbprint.
    """
    # (1)
    if not isinstance(document, Mapping) or set(document) != _FIELDS:
        raise InvalidKeySet(f"a key set has exactly the members {sorted(_FIELDS)}")
    if document["type"] != KEY_SET_TYPE:
        raise InvalidKeySet(f"type is {document['type']!r}, not {KEY_SET_TYPE!r}")
    keys, signatures = document["keys"], document["signatures"]
    if not isinstance(keys, list) or not isinstance(signatures, list):
        raise InvalidKeySet("keys and signatures must be arrays")
    # (2)
    mine = [s for s in signatures if isinstance(s, Mapping) and s.get("kid") == pinned.key_id]
    if not mine:
        raise InvalidKeySet(f"the key set is not signed by the pinned key {pinned.key_id}")
    if not any(isinstance(jwk, Mapping) and jwk.get("kid") == pinned.key_id for jwk in keys):
        raise InvalidKeySet(f"the pinned key {pinned.key_id} is not listed")
    # (3)
    body = {name: value for name, value in document.items() if name != "signatures"}
    try:
        message = canonical_json(body)
        signature = b64url_decode(str(mine[0].get("signature")))
    except (CanonicalizationError, UnicodeError, ValueError) as exc:
        raise InvalidKeySet(f"the key set cannot be checked: {exc}") from None
    try:
        pinned._verify(signature, message)
    except InvalidSignature:
        raise InvalidKeySet(f"the signature by {pinned.key_id} does not verify") from None
    # (4)
    out = []
    for jwk in keys:
        try:
            key = VerifyingKey.from_jwk({k: v for k, v in jwk.items() if k != "status"})
        except (KeyringError, AttributeError) as exc:
            raise InvalidKeySet(f"a listed key is not usable: {exc}") from None
        out.append(key)
    if document["active"] not in {key.key_id for key in out}:
        raise InvalidKeySet("the active key is not listed")
    return out
