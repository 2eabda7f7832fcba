"""Why offline verification failed: the typed errors of ``verify.py`` and ``claim.py``.

::

    VerificationError            reason, line, seq, source; str() names all of them
    ├─ BundleDefect              the bundle breaks a chain rule at one line
    │  ├─ EmptyBundle            no entries at all
    │  ├─ MalformedEntry         not a UTF-8 JSON object, wrong fields or types
    │  ├─ NotCanonical           the line is not the RFC 8785 form of its entry
    │  ├─ SequenceGap            seq is not the previous seq + 1
    │  ├─ BrokenLink             prev is not the previous entry's hash
    │  ├─ HashMismatch           hash is not SHA-256(prev || JCS(entry without hash))
    │  ├─ GenesisInvalid         line 1 is not a genesis entry
    │  ├─ AttestationInvalid     line 2 is not an attestation entry binding the root
    │  ├─ SessionMismatch        an entry of another evidence session
    │  ├─ LifecycleViolation     a session_open after seq 1, or anything after the close
    │  └─ KeyMismatch            the genesis names another signing key than the one given
    └─ ClaimDefect               the TRACE claim
       ├─ ClaimMalformed         not canonical JSON, or not the shape ``claim.py`` issues
       ├─ ClaimSignatureInvalid  not signed by the trusted key
       └─ ClaimMismatch          the claim states something the bundle does not

These are deliberately not :class:`bastion.errors.BastionError` subclasses:
they never reach the wire, carry no JSON-RPC code, and are rendered by the
CLI only. ``reason`` is stable and machine-readable; ``line`` is 1-based.
"""

from __future__ import annotations

import enum
from typing import ClassVar

__all__ = [
    "AttestationInvalid",
    "BrokenLink",
    "BundleDefect",
    "ClaimDefect",
    "ClaimMalformed",
    "ClaimMismatch",
    "ClaimSignatureInvalid",
    "EmptyBundle",
    "GenesisInvalid",
    "HashMismatch",
    "KeyMismatch",
    "LifecycleViolation",
    "MalformedEntry",
    "NotCanonical",
    "SequenceGap",
    "SessionMismatch",
    "VerificationError",
    "VerificationReason",
]


class VerificationReason(enum.StrEnum):
    EMPTY_BUNDLE = "empty_bundle"
    MALFORMED_ENTRY = "malformed_entry"
    NOT_CANONICAL = "not_canonical"
    SEQUENCE_GAP = "sequence_gap"
    BROKEN_LINK = "broken_link"
    HASH_MISMATCH = "hash_mismatch"
    GENESIS_INVALID = "genesis_invalid"
    ATTESTATION_INVALID = "attestation_invalid"
    SESSION_MISMATCH = "session_mismatch"
    LIFECYCLE_VIOLATION = "lifecycle_violation"
    KEY_MISMATCH = "key_mismatch"
    CLAIM_MALFORMED = "claim_malformed"
    CLAIM_SIGNATURE_INVALID = "claim_signature_invalid"
    CLAIM_MISMATCH = "claim_mismatch"


class VerificationError(Exception):
    """Evidence that does not verify. ``str()`` reads ``source: line N (seq S): reason: detail``."""

    reason: ClassVar[VerificationReason]

    def __init__(
        self,
        detail: str,
        *,
        line: int | None = None,
        seq: int | None = None,
        source: str | None = None,
    ) -> None:
        self.detail = detail
        self.line = line
        self.seq = seq
        self.source = source
        super().__init__(detail)

    def __str__(self) -> str:
        where = []
        if self.source is not None:
            where.append(self.source)
        if self.line is not None:
            where.append(f"line {self.line}" + (f" (seq {self.seq})" if self.seq is not None else ""))
        prefix = ": ".join(where)
        return f"{prefix + ': ' if prefix else ''}{self.reason.value}: {self.detail}"


class BundleDefect(VerificationError):
    """The bundle breaks a chain rule at ``line``."""


class EmptyBundle(BundleDefect):
    reason = VerificationReason.EMPTY_BUNDLE


class MalformedEntry(BundleDefect):
    reason = VerificationReason.MALFORMED_ENTRY


class NotCanonical(BundleDefect):
    reason = VerificationReason.NOT_CANONICAL


class SequenceGap(BundleDefect):
    reason = VerificationReason.SEQUENCE_GAP


class BrokenLink(BundleDefect):
    reason = VerificationReason.BROKEN_LINK


class HashMismatch(BundleDefect):
    reason = VerificationReason.HASH_MISMATCH


class GenesisInvalid(BundleDefect):
    reason = VerificationReason.GENESIS_INVALID


class AttestationInvalid(BundleDefect):
    reason = VerificationReason.ATTESTATION_INVALID


class SessionMismatch(BundleDefect):
    reason = VerificationReason.SESSION_MISMATCH


class LifecycleViolation(BundleDefect):
    reason = VerificationReason.LIFECYCLE_VIOLATION


class KeyMismatch(BundleDefect):
    reason = VerificationReason.KEY_MISMATCH


class ClaimDefect(VerificationError):
    """The TRACE claim is malformed, unsigned by the trusted key, or contradicts the bundle."""


class ClaimMalformed(ClaimDefect):
    reason = VerificationReason.CLAIM_MALFORMED


class ClaimSignatureInvalid(ClaimDefect):
    reason = VerificationReason.CLAIM_SIGNATURE_INVALID


class ClaimMismatch(ClaimDefect):
    reason = VerificationReason.CLAIM_MISMATCH
