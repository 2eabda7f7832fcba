"""The offline verifier: audit bundles, their TRACE claims, and joins on execution_id (DESIGN section 4).

``bastion verify`` runs this with nothing but files and a public key. It must
stay offline: it imports nothing that opens a socket or a database (a test
imports it with ``socket`` and ``sqlite3`` blocked). It streams: a bundle is
read line by line and only the genesis, the attestation entry and the current
entry are held, so memory stays flat in the size of the bundle.

A bundle verifies when every line passes the six checks of ``walk.py``
(fields and types, RFC 8785 form, seq continuity, prev link, hash, and the
chain's shape); the first failing line raises a
:class:`~bastion.audit.errors.BundleDefect` naming its line, seq and defect.

With a claim, in the order TRACE v0.2 section 3.3 asks (nothing in the claim
is trusted before its signature verifies):

1. the claim file is the RFC 8785 form of its claim, and the signature
   verifies under the trusted key (``crypto/sign.py``);
2. the claim has exactly the shape ``claim.py`` issues;
3. the bundle verifies, streaming;
4. the genesis names the trusted key as the session's signing key;
5. everything the claim states matches the chain (``ClaimMismatch`` names it).

Without a claim, steps 3 and 4 still run: the given key must be the one the
session was opened under.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from bastion.audit.chain import GENESIS_SEQ, ChainSummary
from bastion.audit.claim import ClaimFacts, attestation_digest, read_claim_facts, runtime_claims
from bastion.audit.entry import AuditEntry
from bastion.audit.errors import ClaimMalformed, ClaimMismatch, ClaimSignatureInvalid, KeyMismatch
from bastion.audit.fanout import walk_file
from bastion.audit.walk import read_lines, summarize, walk_lines
from bastion.crypto.jcs import CanonicalizationError, canonical_json
from bastion.crypto.keys import VerifyingKey
from bastion.crypto.sign import InvalidClaimSignature, verify_claim

__all__ = [
    "JoinedRecord",
    "join_execution",
    "parse_unverified_claim",
    "verify_bundle",
    "verify_bundle_file",
    "verify_chain",
]


@dataclass(frozen=True, slots=True)
class JoinedRecord:
    """One entry that carries the execution id asked for, and where it was found."""

    bundle: Path
    line: int
    entry: AuditEntry


def parse_unverified_claim(data: bytes) -> dict[str, Any]:
    """The claim object in a claim file, not yet verified; raises :class:`ClaimMalformed`.

    The file must be the RFC 8785 form of a JSON object, optionally followed by
    one ``\\n`` (``export.claim_bytes``); no other spelling is accepted.
    """
    body = data[:-1] if data.endswith(b"\n") else data
    try:
        claim = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ClaimMalformed(f"claim file is not JSON: {exc}") from None
    if not isinstance(claim, dict):
        raise ClaimMalformed("claim file is not a JSON object")
    try:
        canonical = canonical_json(claim)
    except (CanonicalizationError, UnicodeError) as exc:
        raise ClaimMalformed(f"claim has no RFC 8785 form: {exc}") from None
    if canonical != body:
        raise ClaimMalformed("claim file is not the RFC 8785 canonical form of its claim")
    return claim


def verify_bundle(
    lines: Iterable[bytes],
    *,
    key: VerifyingKey,
    claim: Mapping[str, Any] | None = None,
    source: str | None = None,
) -> ChainSummary:
    """Verify a bundle's lines, and its claim when given, against the trusted ``key``.

    Returns the chain's summary. Raises a
    :class:`~bastion.audit.errors.VerificationError` for the first defect.
    """
    facts = _check_claim(claim, key, source=source)
    summary = verify_chain(lines, source=source)
    return _check_against(summary, facts, key, source=source, claim_source=source)


def verify_bundle_file(
    bundle: Path,
    *,
    key: VerifyingKey,
    claim: Path | None = None,
    jobs: int = 1,
) -> ChainSummary:
    """:func:`verify_bundle` on files, the bundle optionally walked by ``jobs`` processes.

    ``OSError`` propagates for a file that cannot be read. ``jobs`` > 1 forks
    (see ``walk.walk_file``); the verdict and the defect reported are the same.
    """
    claim_obj = None
    if claim is not None:
        try:
            claim_obj = parse_unverified_claim(claim.read_bytes())
        except ClaimMalformed as exc:
            exc.source = str(claim)
            raise
    source = str(bundle)
    claim_source = str(claim) if claim is not None else None
    facts = _check_claim(claim_obj, key, source=claim_source)
    summary = summarize(walk_file(bundle, source=source, jobs=jobs), source=source)
    return _check_against(summary, facts, key, source=source, claim_source=claim_source)


def verify_chain(lines: Iterable[bytes], *, source: str | None = None) -> ChainSummary:
    """Check every line of a bundle (``walk.py``); returns the chain's summary.

    Raises a :class:`~bastion.audit.errors.BundleDefect` for the first bad line.
    """
    return summarize(walk_lines(lines, source=source), source=source)


def join_execution(bundles: Sequence[Path], execution_id: str) -> Iterator[JoinedRecord]:
    """The entries across ``bundles`` that carry ``execution_id``, by ts, then bundle order, then line.

    Each bundle's chain is verified as it is read (no claim, no key), and a
    defect raises, naming the bundle. The result shows records that share an
    *asserted* execution id; it does not show they are one logical operation
    (compare their ``binding``). Memory grows with the matches only.
    """
    found: list[tuple[str, int, int, JoinedRecord]] = []
    for index, path in enumerate(bundles):
        with open(path, "rb") as handle:
            lines = read_lines(handle, source=str(path))
            stretch = walk_lines(lines, source=str(path), execution_id=execution_id)
        summarize(stretch, source=str(path))
        for line, data in stretch.matches:
            record = JoinedRecord(bundle=path, line=line, entry=AuditEntry.from_json(data))
            found.append((record.entry.ts, index, line, record))
    found.sort(key=itemgetter(0, 1, 2))
    return (record for *_, record in found)


def _check_claim(
    claim: Mapping[str, Any] | None, key: VerifyingKey, *, source: str | None
) -> ClaimFacts | None:
    """Steps 1 and 2: the claim's signature, then its shape."""
    if claim is None:
        return None
    try:
        verify_claim(claim, key)
    except InvalidClaimSignature as exc:
        raise ClaimSignatureInvalid(str(exc), source=source) from None
    try:
        return read_claim_facts(claim)
    except ClaimMalformed as exc:
        exc.source = source
        raise


def _check_against(
    summary: ChainSummary,
    facts: ClaimFacts | None,
    key: VerifyingKey,
    *,
    source: str | None,
    claim_source: str | None,
) -> ChainSummary:
    """Steps 4 and 5: the genesis key, then every fact the claim states."""
    if summary.key_id != key.key_id:
        raise KeyMismatch(
            f"the genesis names signing key {summary.key_id}, not the given key {key.key_id}",
            line=1,
            seq=GENESIS_SEQ,
            source=source,
        )
    if facts is not None:
        _check_claim_matches(facts, summary, source=claim_source)
    return summary


def _check_claim_matches(facts: ClaimFacts, summary: ChainSummary, *, source: str | None) -> None:
    """Raise :class:`ClaimMismatch` for the first thing the claim states that the chain does not."""
    if summary.close_reason is None:
        raise ClaimMismatch(
            "the bundle has no session_close entry; a claim covers a closed chain", source=source
        )
    if summary.attestation is None:
        raise ClaimMismatch("the bundle has no attestation entry", source=source)
    pairs: list[tuple[str, object, object]] = [
        ("session id", facts.session_id, summary.session_id),
        ("agent", facts.agent, summary.agent),
        ("key id", facts.key_id, summary.key_id),
        ("chain root", facts.root, summary.root),
        ("entry count", facts.entry_count, summary.entry_count),
        ("head hash", facts.head, summary.head),
        ("tool_transcript.hash", facts.transcript_hash, "sha256:" + summary.head),
        ("first entry time", facts.first_ts, summary.first_ts),
        ("last entry time", facts.last_ts, summary.last_ts),
        ("attestation digest", facts.attestation_digest, attestation_digest(summary.attestation)),
        ("runtime", facts.runtime, runtime_claims(summary.attestation)),
        ("close reason", facts.close_reason.value, summary.close_reason.value),
    ]
    for what, claimed, actual in pairs:
        if claimed != actual:
            raise ClaimMismatch(
                f"{what}: the claim says {claimed!r}, the bundle has {actual!r}", source=source
            )
