"""The TRACE claim issued when an evidence session closes (DESIGN section 4).

The claim is a plain TRACE v0.2 Trust Record (``agentrust-trace``'s schema,
``additionalProperties: false`` throughout) with an embedded Ed25519 signature
over its RFC 8785 form (``crypto/sign.py``). The schema has no member for an
audit chain, so Bastion's facts go where the schema puts external facts and
nowhere else:

=====================  ===============================================================
fact                   where
=====================  ===============================================================
agent                  ``subject``: ``spiffe://<trust domain>/agent/<agent>`` (see below)
head hash              ``tool_transcript.hash`` = ``sha256:<head>``, the TRACE-native
                       commitment to the transcript (TRACE v0.2 section 3.3.1)
key id                 ``cnf.jwk.kid`` (RFC 7638 thumbprint of ``cnf.jwk``)
attestation            ``runtime`` (platform, measurement, ``nonce`` = report_data)
session id             ``references[rel=bastion:evidence-session].id``
chain root             ``references[rel=bastion:audit-chain-root]``: id ``<session>#0``,
                       digest ``sha256:<root>``
head, entry count      ``references[rel=bastion:audit-chain-head]``: id ``<session>#<last
                       seq>`` (count = last seq + 1), digest ``sha256:<head>``
attestation record     ``references[rel=bastion:attestation]``: id ``<session>#1``, digest
                       ``sha256:`` of the RFC 8785 bytes of the record in entry seq 1
first and last time    ``references[rel=bastion:time-range].id`` = ``<first ts>/<last ts>``
                       (an ISO 8601 interval of the first and last entries' ``ts``)
close reason           ``references[rel=bastion:close-reason].id``
=====================  ===============================================================

Every reference names the gateway (``ClaimProfile.issuer``) as its resolver:
the bundle is served at ``/audit/export?session_id=``. A claim never contains
an ``execution_id`` value: it is built from a :class:`ChainSummary`, which has
none (DESIGN section 3, rule 3).

Agents are arbitrary strings and SPIFFE path segments are not, so an agent that
is a valid segment (``[A-Za-z0-9._-]+``, not ``.``/``..``, not starting with
``b64.``) is written as is, and any other agent as ``b64.`` + unpadded
base64url of its UTF-8 bytes; the mapping is one-to-one.

This module never does I/O; the offline verifier imports it to read claims.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from bastion.audit.chain import ChainSummary, CloseReason
from bastion.audit.entry import TS_RE
from bastion.audit.errors import ClaimMalformed
from bastion.audit.tee import KIND_CONFIGFS_TSM, KIND_NONE
from bastion.crypto.jcs import MAX_SAFE_INTEGER, canonical_json
from bastion.crypto.keys import Keyring, b64url_decode, b64url_encode
from bastion.crypto.sign import sign_claim

__all__ = [
    "CLAIM_FIELDS",
    "REL_ATTESTATION",
    "REL_CLOSE_REASON",
    "REL_HEAD",
    "REL_ROOT",
    "REL_SESSION",
    "REL_TIME_RANGE",
    "TRACE_PROFILE",
    "ClaimFacts",
    "ClaimProfile",
    "PolicyInForce",
    "agent_from_subject",
    "agent_subject",
    "attestation_digest",
    "build_claim",
    "issue_claim",
    "read_claim_facts",
    "runtime_claims",
]

TRACE_PROFILE: Final = "tag:agentrust-io.com,2026:trace-v0.2"

REL_SESSION: Final = "bastion:evidence-session"
REL_ROOT: Final = "bastion:audit-chain-root"
REL_HEAD: Final = "bastion:audit-chain-head"
REL_ATTESTATION: Final = "bastion:attestation"
REL_TIME_RANGE: Final = "bastion:time-range"
REL_CLOSE_REASON: Final = "bastion:close-reason"
_RELS = (REL_SESSION, REL_ROOT, REL_HEAD, REL_ATTESTATION, REL_TIME_RANGE, REL_CLOSE_REASON)

#: Every top-level member of a claim Bastion issues, and nothing else.
CLAIM_FIELDS: Final = frozenset(
    {
        "eat_profile",
        "iat",
        "subject",
        "model",
        "runtime",
        "policy",
        "data_class",
        "tool_transcript",
        "build_provenance",
        "appraisal",
        "references",
        "cnf",
        "signature",
    }
)

_DIGEST_RE = re.compile(r"sha(256:[0-9a-f]{64}|384:[0-9a-f]{96})")
_SHA256_RE = re.compile(r"sha256:([0-9a-f]{64})")
_TRUST_DOMAIN_RE = re.compile(r"[a-z0-9._-]+")
_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]+")
_SUBJECT_RE = re.compile(r"spiffe://([a-z0-9._-]+)/agent/([A-Za-z0-9._-]+)")
_ENCODED_PREFIX = "b64."
_MIN_IAT = 1_700_000_000

# TEE report layouts, located by their report_data (which check_attestation_record
# guarantees is in the report), so one rule reads TDX quote v4 and v5 alike.
# Intel TDX DCAP quote: the TD report body holds MRTD at +136 and REPORTDATA at +520.
_TDX_MRTD, _TDX_REPORT_DATA = 136, 520
# AMD SEV-SNP ATTESTATION_REPORT: REPORT_DATA at 0x50, MEASUREMENT at 0x90, from byte 0.
_SNP_MEASUREMENT, _SNP_REPORT_DATA = 0x90, 0x50
_MEASUREMENT_LEN = 48


@dataclass(frozen=True, slots=True)
class ClaimProfile:
    """What the gateway states about itself in every claim; validated once, here.

    ``issuer`` is an absolute URI naming this gateway (the appraisal verifier
    and the resolver of every reference). ``build_digest`` is the ``sha256:``
    or ``sha384:`` digest of the deployed gateway build. A gateway does not see
    which model drives an agent, so the model defaults to ``unknown``; and it
    does not classify data, so ``data_class`` defaults to ``unclassified``.
    Raises ``ValueError`` for a value the TRACE schema would refuse.
    """

    trust_domain: str
    issuer: str
    build_digest: str
    slsa_level: int = 0
    data_class: str = "unclassified"
    model_provider: str = "unknown"
    model_id: str = "unknown"
    enforcement_mode: Literal["enforce", "advisory", "silent"] = "enforce"

    def __post_init__(self) -> None:
        if not _TRUST_DOMAIN_RE.fullmatch(self.trust_domain):
            raise ValueError(f"trust domain {self.trust_domain!r} is not a SPIFFE trust domain")
        _check_uri("issuer", self.issuer)
        if not _DIGEST_RE.fullmatch(self.build_digest):
            raise ValueError("build_digest must be sha256:<64 hex> or sha384:<96 hex>")
        if type(self.slsa_level) is not int or not 0 <= self.slsa_level <= 3:
            raise ValueError("slsa_level must be 0..3")
        if not self.data_class or not self.model_provider or not self.model_id:
            raise ValueError("data_class, model_provider and model_id must not be empty")
        if self.enforcement_mode not in ("enforce", "advisory", "silent"):
            raise ValueError(f"unknown enforcement mode {self.enforcement_mode!r}")


@dataclass(frozen=True, slots=True)
class PolicyInForce:
    """The policy snapshot in force when the claim is issued."""

    bundle_hash: str
    version: str | None = None

    def __post_init__(self) -> None:
        if not _DIGEST_RE.fullmatch(self.bundle_hash):
            raise ValueError("policy bundle_hash must be sha256:<64 hex> or sha384:<96 hex>")


@dataclass(frozen=True, slots=True)
class ClaimFacts:
    """What a claim states about its chain, read back by :func:`read_claim_facts`."""

    session_id: str
    agent: str
    root: str
    head: str
    entry_count: int
    first_ts: str
    last_ts: str
    key_id: str
    attestation_digest: str
    close_reason: CloseReason
    runtime: dict[str, Any]
    transcript_hash: str


def agent_subject(trust_domain: str, agent: str) -> str:
    """The SPIFFE ID that names ``agent`` as a claim's ``subject``."""
    if not agent:
        raise ValueError("agent must not be empty")
    if _SEGMENT_RE.fullmatch(agent) and agent not in (".", "..") and not agent.startswith(_ENCODED_PREFIX):
        segment = agent
    else:
        segment = _ENCODED_PREFIX + b64url_encode(agent.encode("utf-8"))
    return f"spiffe://{trust_domain}/agent/{segment}"


def agent_from_subject(subject: str) -> str:
    """The agent named by a claim's ``subject``; raises ``ValueError`` for any other subject."""
    match = _SUBJECT_RE.fullmatch(subject) if isinstance(subject, str) else None
    if match is None:
        raise ValueError(f"subject {subject!r} is not a Bastion agent SPIFFE ID")
    segment = match.group(2)
    if not segment.startswith(_ENCODED_PREFIX):
        if segment in (".", ".."):
            raise ValueError("subject path segment is '.' or '..'")
        return segment
    agent = b64url_decode(segment[len(_ENCODED_PREFIX) :]).decode("utf-8")
    if agent_subject(match.group(1), agent) != subject:
        raise ValueError("subject encodes its agent in a non-canonical way")
    return agent


def attestation_digest(attestation: Mapping[str, Any]) -> str:
    """``sha256:`` of the RFC 8785 bytes of an attestation record."""
    return "sha256:" + hashlib.sha256(canonical_json(dict(attestation))).hexdigest()


def runtime_claims(attestation: Mapping[str, Any]) -> dict[str, Any]:
    """The TRACE ``runtime`` block for an attestation record (see ``tee.py``).

    A TDX quote or SEV-SNP report whose layout is recognized yields
    ``intel-tdx`` / ``amd-sev-snp`` with the launch measurement (MRTD /
    MEASUREMENT) as ``sha384:``. Anything else, including every ``kind: none``
    record, is ``software-only`` with the digest of the record as its
    measurement: never claim more hardware than was shown.
    """
    record = dict(attestation)
    software = {"platform": "software-only", "measurement": attestation_digest(record)}
    if record.get("kind") == KIND_NONE:
        return software
    if record.get("kind") != KIND_CONFIGFS_TSM:
        raise ValueError(f"unknown attestation kind {record.get('kind')!r}")
    report_data = bytes.fromhex(record["report_data"])
    nonce = b64url_encode(report_data)
    outblob = b64url_decode(record["outblob"])
    at = outblob.find(report_data)
    provider = record["provider"]
    measurement: bytes | None = None
    platform = "software-only"
    if provider == "tdx_guest":
        body = at - _TDX_REPORT_DATA
        # Header: version 4 or 5 (u16 LE), TEE type 0x81 = TDX (u32 LE at +4), 48 bytes.
        if (
            at >= 0
            and body >= 48
            and int.from_bytes(outblob[0:2], "little") in (4, 5)
            and int.from_bytes(outblob[4:8], "little") == 0x81
        ):
            measurement = outblob[body + _TDX_MRTD : body + _TDX_MRTD + _MEASUREMENT_LEN]
            platform = "intel-tdx"
    elif provider == "sev_guest" and at == _SNP_REPORT_DATA and len(outblob) >= 0x2A0:
        measurement = outblob[_SNP_MEASUREMENT : _SNP_MEASUREMENT + _MEASUREMENT_LEN]
        platform = "amd-sev-snp"
    if measurement is None:
        return {**software, "nonce": nonce}
    return {"platform": platform, "measurement": "sha384:" + measurement.hex(), "nonce": nonce}


def build_claim(
    summary: ChainSummary,
    *,
    profile: ClaimProfile,
    policy: PolicyInForce,
    issued_at: datetime,
) -> dict[str, Any]:
    """The unsigned claim for a closed chain; :func:`issue_claim` signs it.

    Raises ``ValueError`` if the chain is not closed or has no attestation entry.
    """
    if summary.close_reason is None:
        raise ValueError("a claim is issued for a closed chain only")
    if summary.attestation is None:
        raise ValueError("the chain has no attestation entry")
    iat = int(issued_at.timestamp())
    if iat < _MIN_IAT:
        raise ValueError("issued_at is before the TRACE iat floor (2023-11-14)")
    sid = summary.session_id
    resolver = profile.issuer
    policy_block: dict[str, Any] = {
        "bundle_hash": policy.bundle_hash,
        "enforcement_mode": profile.enforcement_mode,
    }
    if policy.version is not None:
        policy_block["version"] = policy.version
    return {
        "eat_profile": TRACE_PROFILE,
        "iat": iat,
        "subject": agent_subject(profile.trust_domain, summary.agent),
        "model": {"provider": profile.model_provider, "model_id": profile.model_id},
        "runtime": runtime_claims(summary.attestation),
        "policy": policy_block,
        "data_class": profile.data_class,
        "tool_transcript": {"hash": "sha256:" + summary.head},
        "build_provenance": {"slsa_level": profile.slsa_level, "digest": profile.build_digest},
        "appraisal": {"status": "none", "verifier": profile.issuer},
        "references": [
            {"rel": REL_SESSION, "id": sid, "resolver": resolver},
            {"rel": REL_ROOT, "id": f"{sid}#0", "resolver": resolver, "digest": "sha256:" + summary.root},
            {
                "rel": REL_HEAD,
                "id": f"{sid}#{summary.entry_count - 1}",
                "resolver": resolver,
                "digest": "sha256:" + summary.head,
            },
            {
                "rel": REL_ATTESTATION,
                "id": f"{sid}#1",
                "resolver": resolver,
                "digest": attestation_digest(summary.attestation),
            },
            {"rel": REL_TIME_RANGE, "id": f"{summary.first_ts}/{summary.last_ts}", "resolver": resolver},
            {"rel": REL_CLOSE_REASON, "id": summary.close_reason.value, "resolver": resolver},
        ],
    }


def issue_claim(
    summary: ChainSummary,
    *,
    profile: ClaimProfile,
    policy: PolicyInForce,
    keyring: Keyring,
    issued_at: datetime,
) -> dict[str, Any]:
    """The signed TRACE claim for a closed chain.

    Raises ``ValueError`` (see :func:`build_claim`), including when the chain's
    genesis names another key than the keyring's active one: claims of
    sessions opened under a key are issued before that key is rotated away.
    """
    if summary.key_id != keyring.key_id:
        raise ValueError(f"the chain was opened under key {summary.key_id}, not the active {keyring.key_id}")
    return sign_claim(build_claim(summary, profile=profile, policy=policy, issued_at=issued_at), keyring)


def read_claim_facts(claim: Mapping[str, Any]) -> ClaimFacts:
    """Read what a claim states about its chain; raises :class:`ClaimMalformed`.

    Checks the shape Bastion issues, exactly: the top-level members, the TRACE
    profile, one reference per Bastion relation and no other, and the syntax
    of every value read. It does not check the signature (``verify_claim``).
    """
    try:
        return _read_claim_facts(claim)
    except ClaimMalformed:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ClaimMalformed(f"claim is not a Bastion TRACE claim: {exc}") from exc


def _read_claim_facts(claim: Mapping[str, Any]) -> ClaimFacts:
    if not isinstance(claim, Mapping):
        raise ClaimMalformed("claim is not a JSON object")
    if set(claim) != CLAIM_FIELDS:
        missing = sorted(CLAIM_FIELDS - set(claim))
        extra = sorted(set(claim) - CLAIM_FIELDS)
        raise ClaimMalformed(f"claim members differ: missing={missing} extra={extra}")
    if claim["eat_profile"] != TRACE_PROFILE:
        raise ClaimMalformed(f"eat_profile is {claim['eat_profile']!r}, not {TRACE_PROFILE!r}")
    iat = claim["iat"]
    if type(iat) is not int or not _MIN_IAT <= iat <= MAX_SAFE_INTEGER:
        raise ClaimMalformed("iat is not a Unix time in the TRACE range")
    refs = _references(claim["references"])
    sid = refs[REL_SESSION]["id"]
    root = _sha256_of(refs[REL_ROOT], "chain root")
    head = _sha256_of(refs[REL_HEAD], "chain head")
    if refs[REL_ROOT]["id"] != f"{sid}#0" or refs[REL_ATTESTATION]["id"] != f"{sid}#1":
        raise ClaimMalformed("chain root / attestation references do not point into the session")
    head_id = refs[REL_HEAD]["id"]
    prefix = f"{sid}#"
    last_seq_text = head_id[len(prefix) :] if head_id.startswith(prefix) else ""
    if not last_seq_text.isdigit() or not last_seq_text.isascii() or str(int(last_seq_text)) != last_seq_text:
        raise ClaimMalformed(f"chain head reference id {head_id!r} is not <session>#<seq>")
    first_ts, sep, last_ts = refs[REL_TIME_RANGE]["id"].partition("/")
    if not sep or not TS_RE.fullmatch(first_ts) or not TS_RE.fullmatch(last_ts):
        raise ClaimMalformed("time range is not <first ts>/<last ts>")
    attestation_ref = refs[REL_ATTESTATION].get("digest")
    if not isinstance(attestation_ref, str) or not _SHA256_RE.fullmatch(attestation_ref):
        raise ClaimMalformed("attestation reference has no sha256 digest")
    transcript = claim["tool_transcript"]
    if not isinstance(transcript, Mapping) or set(transcript) != {"hash"}:
        raise ClaimMalformed("tool_transcript holds exactly the chain head hash")
    kid = claim["cnf"]["jwk"]["kid"]
    if not isinstance(kid, str):
        raise ClaimMalformed("cnf.jwk.kid is not a key id")
    runtime = claim["runtime"]
    if not isinstance(runtime, Mapping):
        raise ClaimMalformed("runtime is not an object")
    return ClaimFacts(
        session_id=sid,
        agent=agent_from_subject(claim["subject"]),
        root=root,
        head=head,
        entry_count=int(last_seq_text) + 1,
        first_ts=first_ts,
        last_ts=last_ts,
        key_id=kid,
        attestation_digest=attestation_ref,
        close_reason=CloseReason(refs[REL_CLOSE_REASON]["id"]),
        runtime=dict(runtime),
        transcript_hash=transcript["hash"],
    )


def _references(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, list):
        raise ClaimMalformed("references is not an array")
    refs: dict[str, dict[str, Any]] = {}
    for ref in value:
        if not isinstance(ref, dict) or not {"rel", "id", "resolver"} <= set(ref):
            raise ClaimMalformed("a reference lacks rel, id or resolver")
        rel = ref["rel"]
        if rel not in _RELS:
            raise ClaimMalformed(f"unexpected reference relation {rel!r}")
        if rel in refs:
            raise ClaimMalformed(f"reference relation {rel!r} appears twice")
        if not isinstance(ref["id"], str) or not ref["id"]:
            raise ClaimMalformed(f"reference {rel!r} has no id")
        refs[rel] = ref
    missing = [rel for rel in _RELS if rel not in refs]
    if missing:
        raise ClaimMalformed(f"claim lacks references {missing}")
    return refs


def _sha256_of(ref: Mapping[str, Any], what: str) -> str:
    match = _SHA256_RE.fullmatch(ref.get("digest", "")) if isinstance(ref.get("digest"), str) else None
    if match is None:
        raise ClaimMalformed(f"{what} reference has no sha256 digest")
    return match.group(1)


def _check_uri(name: str, value: str) -> None:
    if not isinstance(value, str) or any(ch.isspace() or ord(ch) < 0x20 for ch in value):
        raise ValueError(f"{name} must be an absolute URI without whitespace")
    parts = urlsplit(value)
    if (
        not parts.scheme
        or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", parts.scheme)
        or not (parts.netloc or parts.path)
    ):
        raise ValueError(f"{name} {value!r} is not an absolute URI")
