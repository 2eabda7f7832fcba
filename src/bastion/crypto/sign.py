"""Signing and verifying claims: Ed25519 over RFC 8785 canonical JSON (DESIGN section 4).

The only way Bastion signs anything. A claim is a JSON object; signing sets
``cnf.jwk`` to the active public key (with ``kid`` = key id) and adds an
embedded ``signature`` member: unpadded base64url of the Ed25519 signature over
the RFC 8785 bytes of the object without ``signature``. That is the embedded
form of TRACE v0.2 section 3.2.2, so a signed TRACE Trust Record verifies with
``agentrust_trace.verify_record`` and the ``trace-tests`` suite as well.

Callers never see key bytes and never choose an algorithm. :func:`verify_claim`
returns ``None`` or raises :class:`InvalidClaimSignature`; there is no boolean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature

from bastion.crypto.jcs import CanonicalizationError, canonical_json
from bastion.crypto.keys import Keyring, KeyringError, VerifyingKey, b64url_decode, b64url_encode

__all__ = ["SIGNATURE_FIELD", "InvalidClaimSignature", "sign_claim", "verify_claim"]

SIGNATURE_FIELD = "signature"


class InvalidClaimSignature(Exception):
    """The claim is not signed, is signed by another key, or its signature does not verify."""


def sign_claim(claim: Mapping[str, Any], keyring: Keyring) -> dict[str, Any]:
    """A copy of ``claim`` bound to the active key: ``cnf.jwk`` set, ``signature`` added.

    Raises ``ValueError`` if ``claim`` already carries a signature, and
    :class:`~bastion.crypto.jcs.CanonicalizationError` if it has no RFC 8785 form.
    """
    if SIGNATURE_FIELD in claim:
        raise ValueError("claim is already signed")
    body: dict[str, Any] = {**claim, "cnf": {"jwk": keyring.active.to_jwk()}}
    signature = keyring._sign(canonical_json(body))
    return {**body, SIGNATURE_FIELD: b64url_encode(signature)}


def verify_claim(claim: Mapping[str, Any], key: VerifyingKey) -> None:
    """Check that ``claim`` was signed by ``key``; raises :class:`InvalidClaimSignature`.

    Steps, in order; nothing in the claim is trusted before the last one passes:

    1. ``signature`` is present and is canonical unpadded base64url of 64 bytes.
    2. ``cnf.jwk`` is an Ed25519 JWK whose thumbprint is ``key``'s key id (and
       whose ``kid``, if any, says so too): a trusted key must not vouch for a
       claim that names another confirmation key.
    3. The Ed25519 signature verifies over the RFC 8785 bytes of the claim
       without ``signature``.
    """
    if not isinstance(claim, Mapping):
        raise InvalidClaimSignature("claim is not a JSON object")
    # (1)
    encoded = claim.get(SIGNATURE_FIELD)
    if encoded is None:
        raise InvalidClaimSignature("claim has no signature")
    try:
        signature = b64url_decode(encoded)
    except ValueError as exc:
        raise InvalidClaimSignature(f"signature is malformed: {exc}") from exc
    if len(signature) != 64:
        raise InvalidClaimSignature(f"signature is {len(signature)} bytes, not 64")
    # (2)
    cnf = claim.get("cnf")
    jwk = cnf.get("jwk") if isinstance(cnf, Mapping) else None
    if not isinstance(jwk, Mapping):
        raise InvalidClaimSignature("claim has no cnf.jwk confirmation key")
    try:
        named = VerifyingKey.from_jwk(jwk)
    except KeyringError as exc:
        raise InvalidClaimSignature(f"cnf.jwk is not usable: {exc}") from exc
    if named.key_id != key.key_id:
        raise InvalidClaimSignature(
            f"claim is signed by key {named.key_id}, not by the trusted key {key.key_id}"
        )
    # (3)
    body = {name: value for name, value in claim.items() if name != SIGNATURE_FIELD}
    try:
        message = canonical_json(body)
    except (CanonicalizationError, UnicodeError) as exc:
        raise InvalidClaimSignature(f"claim has no RFC 8785 form: {exc}") from exc
    try:
        key._verify(signature, message)
    except InvalidSignature:
        raise InvalidClaimSignature(f"signature does not verify under key {key.key_id}") from None
