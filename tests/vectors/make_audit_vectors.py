"""Regenerate the audit bundle and TRACE claim vectors in this folder.

Run ``.venv/bin/python tests/vectors/make_audit_vectors.py`` after changing the
chain, export or claim format; ``tests/unit/audit/test_audit_vectors.py``
fails while the files differ from what this script writes. Everything is
deterministic: a fixed Ed25519 seed (a test key, not a secret), fixed times,
a fixed nonce. Each negative vector is named for its one defect.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion.audit.chain import ChainBuilder, CloseReason
from bastion.audit.claim import ClaimProfile, PolicyInForce, build_claim, issue_claim
from bastion.audit.entry import AuditEntry, AuditEvent
from bastion.audit.export import claim_bytes, entry_line
from bastion.audit.tee import no_attestation
from bastion.crypto.jcs import canonical_json
from bastion.crypto.keys import Keyring
from bastion.crypto.sign import sign_claim

HERE = Path(__file__).parent
VECTOR_SEED = bytes(range(32))  # test vectors only
OTHER_SEED = bytes(range(32, 64))  # "another gateway's key", for claim_wrong_key
T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
SESSION = "ev_0123456789abcdef0123456789abcdef"
AGENT = "agent-alice"
PROFILE = ClaimProfile(
    trust_domain="bastion.test",
    issuer="spiffe://bastion.test/gateway",
    build_digest="sha256:" + "ab" * 32,
)
POLICY = PolicyInForce(bundle_hash="sha256:" + "cd" * 32, version="7")


def keyring_from_seed(seed: bytes, data_dir: Path) -> Keyring:
    """A keyring in ``data_dir`` holding the Ed25519 key made from ``seed``."""
    key = Ed25519PrivateKey.from_private_bytes(seed)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    keys = data_dir / "keys"
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = keys / "signing.pem"
    path.write_bytes(pem)
    path.chmod(0o600)
    return Keyring.open(data_dir)


def valid_chain(key_id: str) -> list[AuditEntry]:
    """A closed chain of 7 entries; seq 2, 3 and 5 carry an execution id, as calls do."""
    chain = ChainBuilder.open(session_id=SESSION, agent=AGENT, key_id=key_id, at=T0, nonce="N" * 43)
    chain.bind_attestation(no_attestation("configfs-tsm is not available at /nonexistent"), at=T0)
    step = timedelta(milliseconds=250)
    chain.append(
        AuditEvent.ADMITTED,
        at=T0 + step,
        call_id="call_000000000000000000000001",
        execution_id="exec-7f3a",
        server="files",
        tool="write_file",
        args_digest="sha256:" + "11" * 32,
        binding="22" * 32,
        decision="allow",
        policy_version="7",
    )
    chain.append(
        AuditEvent.COMPLETED,
        at=T0 + 2 * step,
        call_id="call_000000000000000000000001",
        execution_id="exec-7f3a",
        server="files",
        tool="write_file",
        binding="22" * 32,
        outcome="completed",
        policy_version="7",
        detail={"latency_ms": 12},
    )
    chain.append(
        AuditEvent.REFUSED,
        at=T0 + 3 * step,
        call_id="call_000000000000000000000002",
        server="files",
        tool="delete_file",
        decision="deny",
        reason="grant_denied",
        policy_version="7",
    )
    chain.append(
        AuditEvent.REPLAY,
        at=T0 + 4 * step,
        call_id="call_000000000000000000000003",
        execution_id="exec-7f3a",
        server="files",
        tool="write_file",
        binding="22" * 32,
        decision="deny",
        reason="execution_replay",
        detail={"earlier_outcome": "completed"},
    )
    chain.close(CloseReason.CLIENT_DELETE, at=T0 + 5 * step)
    return list(chain.entries)


def other_agent_chain(key_id: str) -> list[AuditEntry]:
    """Bob's closed chain whose one call asserts Alice's execution id ``exec-7f3a``, with another binding."""
    chain = ChainBuilder.open(
        session_id="ev_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
        agent="agent-bob",
        key_id=key_id,
        at=T0,
        nonce="B" * 43,
    )
    chain.bind_attestation(no_attestation("configfs-tsm is not available at /nonexistent"), at=T0)
    chain.append(
        AuditEvent.COMPLETED,
        at=T0 + timedelta(milliseconds=100),
        call_id="call_00000000000000000000000b",
        execution_id="exec-7f3a",
        server="files",
        tool="write_file",
        binding="33" * 32,
        outcome="completed",
        policy_version="7",
    )
    chain.close(CloseReason.CLIENT_DELETE, at=T0 + timedelta(milliseconds=200))
    return list(chain.entries)


def reseal(entries: list[AuditEntry], start: int) -> list[AuditEntry]:
    """Renumber, re-link and re-hash entries from index ``start`` on, as a forger would."""
    out = list(entries[:start])
    for index, entry in enumerate(entries[start:], start=start):
        prev = out[-1].hash if out else entry.prev
        assert prev is not None
        out.append(dataclasses.replace(entry, seq=index, prev=prev, hash=None).seal())
    return out


def bundle(entries: list[AuditEntry]) -> bytes:
    return b"".join(entry_line(entry) for entry in entries)


def vectors(work: Path) -> dict[str, bytes]:
    """Every vector file's name and bytes."""
    keyring = keyring_from_seed(VECTOR_SEED, work / "gateway")
    other = keyring_from_seed(OTHER_SEED, work / "other")
    entries = valid_chain(keyring.key_id)
    lines = bundle(entries).splitlines(keepends=True)
    claim = issue_claim(
        dataclasses.replace(_summary(entries)), profile=PROFILE, policy=POLICY, keyring=keyring, issued_at=T0
    )
    out: dict[str, bytes] = {
        "audit_pubkey.pem": keyring.active.to_pem(),
        "audit_pubkey.jwk.json": canonical_json(keyring.active.to_jwk()) + b"\n",
        "audit_other_pubkey.pem": other.active.to_pem(),
        "bundle_valid.jsonl": bundle(entries),
        "claim_valid.json": claim_bytes(claim),
        "bundle_empty.jsonl": b"",
    }
    # Line 4 (seq 3): prev points at the wrong entry; its own hash is honest.
    forged = dataclasses.replace(entries[3], prev=entries[1].hash, hash=None).seal()
    out["bundle_broken_link.jsonl"] = b"".join(lines[:3]) + entry_line(forged) + b"".join(lines[4:])
    # Line 5 (seq 4): the outcome was edited after sealing.
    edited = dataclasses.replace(entries[4], reason="grant_allowed")
    out["bundle_bad_hash.jsonl"] = b"".join(lines[:4]) + entry_line(edited) + b"".join(lines[5:])
    # Line 4 (seq 3) was deleted: line 4 now holds seq 4.
    out["bundle_seq_gap.jsonl"] = b"".join(lines[:3]) + b"".join(lines[4:])
    # Line 3 (seq 2): a space after a comma, the same entry in a non-canonical spelling.
    out["bundle_not_canonical.jsonl"] = (
        b"".join(lines[:2])
        + lines[2].replace(b',"agent"', b', "agent"', 1).replace(b'","args', b'", "args', 1)
        + b"".join(lines[3:])
    )
    # Line 3 (seq 2): the worker field is gone.
    data = entries[2].to_json()
    del data["worker"]
    out["bundle_missing_field.jsonl"] = (
        b"".join(lines[:2]) + canonical_json(data) + b"\n" + b"".join(lines[3:])
    )
    # Line 1: the genesis carries a call id (the chain re-hashed around it).
    out["bundle_bad_genesis.jsonl"] = bundle(
        reseal([dataclasses.replace(entries[0], call_id="call_x"), *entries[1:]], 0)
    )
    # Line 2: a call entry where the attestation entry belongs.
    out["bundle_missing_attestation.jsonl"] = bundle(reseal([entries[0], *entries[2:]], 1))
    # Line 5 (seq 4): an entry of another evidence session, re-hashed into the chain.
    foreign = dataclasses.replace(entries[4], session_id="ev_ffffffffffffffffffffffffffffffff")
    out["bundle_foreign_session.jsonl"] = bundle(reseal([*entries[:4], foreign, *entries[5:]], 4))
    # Line 8 (seq 7): an entry appended after the close.
    late = dataclasses.replace(entries[5], hash=None)
    out["bundle_entry_after_close.jsonl"] = bundle(reseal([*entries, late], 7))
    # Seq 4 rewritten (a refusal turned into an allow) and every hash after it recomputed:
    # the chain is sound, only the claim (head hash) gives it away (issue #11 point 9).
    rewritten = dataclasses.replace(entries[4], decision="allow", reason=None)
    out["bundle_rewritten_rehashed.jsonl"] = bundle(reseal([*entries[:4], rewritten, *entries[5:]], 4))
    # The close entry dropped: a sound but open chain; only the claim (count, close) gives it away.
    out["bundle_close_dropped.jsonl"] = b"".join(lines[:-1])
    # Another agent's session that asserts the same execution id, for joins (issue #11 point 10).
    out["bundle_other_agent_same_execution.jsonl"] = bundle(other_agent_chain(keyring.key_id))
    # Claims: one defect each, every one but the first two properly signed.
    unsigned = build_claim(_summary(entries), profile=PROFILE, policy=POLICY, issued_at=T0)
    out["claim_wrong_key.json"] = claim_bytes(sign_claim(unsigned, other))
    out["claim_bad_signature.json"] = claim_bytes({**claim, "signature": _flip(claim["signature"])})
    out["claim_not_canonical.json"] = canonical_json(claim).replace(b'","', b'", "', 1) + b"\n"
    out["claim_wrong_count.json"] = claim_bytes(
        sign_claim(_with_ref(unsigned, 2, id=f"{SESSION}#5"), keyring)
    )
    out["claim_wrong_root.json"] = claim_bytes(
        sign_claim(_with_ref(unsigned, 1, digest="sha256:" + "00" * 32), keyring)
    )
    out["claim_wrong_head.json"] = claim_bytes(
        sign_claim({**unsigned, "tool_transcript": {"hash": "sha256:" + entries[5].hash}}, keyring)
    )
    other_session = "ev_ffffffffffffffffffffffffffffffff"
    renamed = _with_ref(unsigned, 0, id=other_session)
    for index, seq in ((1, 0), (2, 6), (3, 1)):
        renamed = _with_ref(renamed, index, id=f"{other_session}#{seq}")
    out["claim_wrong_session.json"] = claim_bytes(sign_claim(renamed, keyring))
    out["claim_wrong_close_reason.json"] = claim_bytes(
        sign_claim(_with_ref(unsigned, 5, id="shutdown"), keyring)
    )
    return out


def _summary(entries: list[AuditEntry]) -> Any:
    from bastion.audit.chain import ChainSummary

    return ChainSummary.of(entries[0], entries[1], entries[-1])


def _with_ref(claim: dict[str, Any], index: int, **changes: str) -> dict[str, Any]:
    refs = [dict(ref) for ref in claim["references"]]
    refs[index].update(changes)
    return {**claim, "references": refs}


def _flip(signature: str) -> str:
    middle = len(signature) // 2
    return signature[:middle] + ("A" if signature[middle] != "A" else "B") + signature[middle + 1 :]


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        for name, data in vectors(Path(work)).items():
            (HERE / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
