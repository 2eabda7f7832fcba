"""The offline verifier: every defect found at its line, every changed byte noticed, nothing online."""

from __future__ import annotations

import subprocess
import sys
import threading
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.audit import fanout, walk
from bastion.audit.errors import (
    AttestationInvalid,
    BrokenLink,
    ClaimMalformed,
    ClaimMismatch,
    ClaimSignatureInvalid,
    EmptyBundle,
    GenesisInvalid,
    HashMismatch,
    KeyMismatch,
    LifecycleViolation,
    MalformedEntry,
    NotCanonical,
    SequenceGap,
    SessionMismatch,
    VerificationError,
)
from bastion.audit.export import entry_line
from bastion.audit.verify import (
    join_execution,
    parse_unverified_claim,
    verify_bundle,
    verify_bundle_file,
    verify_chain,
)
from bastion.crypto.keys import Keyring, VerifyingKey

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
VALID_BUNDLE = (VECTORS / "bundle_valid.jsonl").read_bytes()
VALID_CLAIM = (VECTORS / "claim_valid.json").read_bytes()
KEY = VerifyingKey.load((VECTORS / "audit_pubkey.pem").read_bytes())


def test_the_valid_vector_verifies_with_its_claim() -> None:
    """The valid bundle and claim verify offline with the PEM key and with the JWK key."""
    for key_file in ("audit_pubkey.pem", "audit_pubkey.jwk.json"):
        key = VerifyingKey.load((VECTORS / key_file).read_bytes())
        summary = verify_bundle_file(
            VECTORS / "bundle_valid.jsonl", key=key, claim=VECTORS / "claim_valid.json"
        )
        assert summary.entry_count == 7
        assert summary.close_reason is not None and summary.close_reason.value == "client_delete"
        assert summary.key_id == key.key_id


def test_a_fresh_session_verifies(evidence: Any) -> None:
    """A chain built, exported and claimed by the library verifies with its claim."""
    summary = verify_bundle_file(evidence.bundle_path, key=evidence.keyring.active, claim=evidence.claim_path)
    assert summary == evidence.summary


@pytest.mark.parametrize(
    ("bundle", "claim", "error", "line", "seq"),
    [
        ("bundle_broken_link.jsonl", None, BrokenLink, 4, 3),
        ("bundle_bad_hash.jsonl", None, HashMismatch, 5, 4),
        ("bundle_seq_gap.jsonl", None, SequenceGap, 4, 4),
        ("bundle_not_canonical.jsonl", None, NotCanonical, 3, 2),
        ("bundle_missing_field.jsonl", None, MalformedEntry, 3, None),
        ("bundle_bad_genesis.jsonl", None, GenesisInvalid, 1, 0),
        ("bundle_missing_attestation.jsonl", None, AttestationInvalid, 2, 1),
        ("bundle_foreign_session.jsonl", None, SessionMismatch, 5, 4),
        ("bundle_entry_after_close.jsonl", None, LifecycleViolation, 8, 7),
        ("bundle_empty.jsonl", None, EmptyBundle, None, None),
        ("bundle_valid.jsonl", "claim_wrong_key.json", ClaimSignatureInvalid, None, None),
        ("bundle_valid.jsonl", "claim_bad_signature.json", ClaimSignatureInvalid, None, None),
        ("bundle_valid.jsonl", "claim_not_canonical.json", ClaimMalformed, None, None),
        ("bundle_valid.jsonl", "claim_wrong_count.json", ClaimMismatch, None, None),
        ("bundle_valid.jsonl", "claim_wrong_root.json", ClaimMismatch, None, None),
        ("bundle_valid.jsonl", "claim_wrong_head.json", ClaimMismatch, None, None),
        ("bundle_valid.jsonl", "claim_wrong_session.json", ClaimMismatch, None, None),
        ("bundle_valid.jsonl", "claim_wrong_close_reason.json", ClaimMismatch, None, None),
        ("bundle_bad_hash.jsonl", "claim_valid.json", HashMismatch, 5, 4),
    ],
)
@pytest.mark.parametrize("jobs", [1, 2])
def test_each_defect_is_reported_at_its_line(
    bundle: str,
    claim: str | None,
    error: type[VerificationError],
    line: int | None,
    seq: int | None,
    jobs: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each defect raises its own error naming the first bad line and seq, however many processes walk."""
    monkeypatch.setattr(fanout, "_PARALLEL_MIN_BYTES", 0)
    with pytest.raises(error) as caught:
        verify_bundle_file(VECTORS / bundle, key=KEY, claim=VECTORS / claim if claim else None, jobs=jobs)
    assert (caught.value.line, caught.value.seq) == (line, seq)
    where = f"line {line}" if line is not None else caught.value.reason.value
    assert where in str(caught.value)
    assert caught.value.source is not None and caught.value.source in str(caught.value)


def test_the_claim_names_the_wrong_fact(evidence: Any) -> None:
    """A count mismatch says what the claim states and what the bundle has."""
    with pytest.raises(ClaimMismatch, match="entry count: the claim says 6, the bundle has 7"):
        verify_bundle_file(VECTORS / "bundle_valid.jsonl", key=KEY, claim=VECTORS / "claim_wrong_count.json")


def test_a_bundle_needs_the_key_its_session_was_opened_under(evidence: Any, tmp_path: Path) -> None:
    """Without a claim, the given key must be the one the genesis names."""
    other = Keyring.open(tmp_path / "other")
    with pytest.raises(KeyMismatch) as caught:
        verify_bundle_file(evidence.bundle_path, key=other.active)
    assert (caught.value.line, caught.value.seq) == (1, 0)


def test_a_claim_needs_a_closed_bundle(evidence: Any) -> None:
    """A claim does not verify against a bundle cut before its close entry."""
    lines = evidence.bundle_path.read_bytes().splitlines(keepends=True)[:-1]
    with pytest.raises(ClaimMismatch, match="no session_close"):
        verify_bundle(lines, key=evidence.keyring.active, claim=evidence.claim)


def test_rotation_keeps_old_claims_verifiable(evidence: Any) -> None:
    """After rotation the old claim verifies under the kept old key, not under the new one."""
    old = evidence.keyring.key_id
    evidence.keyring.rotate()
    kept = evidence.keyring.verifying_key(old)
    verify_bundle_file(evidence.bundle_path, key=kept, claim=evidence.claim_path)
    with pytest.raises(ClaimSignatureInvalid):
        verify_bundle_file(evidence.bundle_path, key=evidence.keyring.active, claim=evidence.claim_path)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(position=st.integers(min_value=0, max_value=len(VALID_BUNDLE) - 1), byte=st.integers(0, 255))
def test_every_single_byte_change_to_a_bundle_is_detected(position: int, byte: int) -> None:
    """Changing any one byte of an exported bundle fails verification, with or without its claim."""
    if VALID_BUNDLE[position] == byte:
        return
    mutated = VALID_BUNDLE[:position] + bytes([byte]) + VALID_BUNDLE[position + 1 :]
    claim = parse_unverified_claim(VALID_CLAIM)
    with pytest.raises(VerificationError):
        verify_bundle(mutated.splitlines(keepends=True), key=KEY, claim=claim)
    with pytest.raises(VerificationError):
        verify_bundle(mutated.splitlines(keepends=True), key=KEY)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(position=st.integers(min_value=0, max_value=len(VALID_CLAIM) - 1), byte=st.integers(0, 255))
def test_every_single_byte_change_to_a_claim_is_detected(position: int, byte: int) -> None:
    """Changing any one byte of an exported claim fails verification (unparseable counts as failed)."""
    if VALID_CLAIM[position] == byte:
        return
    mutated = VALID_CLAIM[:position] + bytes([byte]) + VALID_CLAIM[position + 1 :]
    with pytest.raises(VerificationError):
        claim = parse_unverified_claim(mutated)
        verify_bundle(VALID_BUNDLE.splitlines(keepends=True), key=KEY, claim=claim)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.replace(b"\n", b"\r\n"),
        lambda b: b.replace(b"}\n", b"} \n", 1),
        lambda b: b + b"\n",
        lambda b: b"\n" + b,
        lambda b: b.replace(b'"seq":3', b'"seq":3.0'),
        lambda b: b.replace(b'"epoch":null', b'"epoch":true', 1),
        lambda b: b.replace(b'"agent":"agent-alice"', b'"agent":"agent-alice","agent":"agent-alice"', 1),
        lambda b: b.replace(b"agent-alice", b"agent-\\u0061lice", 1),
    ],
)
def test_other_spellings_of_the_same_entries_are_refused(change: Any) -> None:
    """CRLF, extra whitespace or lines, other numbers, wrong types, duplicate keys, escapes: refused."""
    with pytest.raises(VerificationError):
        verify_bundle(change(VALID_BUNDLE).splitlines(keepends=True), key=KEY)


@pytest.mark.parametrize("line", [1, 3])
def test_an_entry_with_its_keys_out_of_order_is_not_canonical(line: int) -> None:
    """An entry whose members are all there but not in RFC 8785 key order is refused as not canonical."""
    lines = VALID_BUNDLE.splitlines(keepends=True)
    entry = orjson.loads(lines[line - 1])
    lines[line - 1] = orjson.dumps(dict(reversed(entry.items()))) + b"\n"
    with pytest.raises(NotCanonical) as caught:
        verify_bundle(lines, key=KEY)
    assert caught.value.line == line


def test_a_time_spelled_with_other_scripts_digits_is_malformed() -> None:
    """A ts whose digits are not ASCII (fullwidth, Arabic-Indic) is refused at its line, canonical or not."""
    for digit in ("\uff12", "\u0662"):
        lines = VALID_BUNDLE.splitlines(keepends=True)
        entry = orjson.loads(lines[2])
        entry["ts"] = digit + entry["ts"][1:]
        lines[2] = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b"\n"
        with pytest.raises(MalformedEntry, match="RFC 3339") as caught:
            verify_bundle(lines, key=KEY)
        assert caught.value.line == 3


def test_a_missing_final_newline_is_accepted() -> None:
    """The last line may lack its newline; that is not a changed byte."""
    verify_bundle(VALID_BUNDLE.rstrip(b"\n").splitlines(keepends=True), key=KEY)


def test_an_overlong_line_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line longer than MAX_LINE is refused by the reader, naming its line."""
    monkeypatch.setattr(walk, "MAX_LINE", 1000)
    monkeypatch.setattr(walk, "_BLOCK", 256)
    path = tmp_path / "long.jsonl"
    path.write_bytes(VALID_BUNDLE.splitlines(keepends=True)[0] + b"x" * 5000 + b"\n")
    with pytest.raises(MalformedEntry, match="longer than 1000") as caught:
        verify_bundle_file(path, key=KEY)
    assert (caught.value.line, caught.value.source) == (2, str(path))


def test_the_verifier_imports_and_runs_with_sockets_and_databases_blocked(tmp_path: Path) -> None:
    """verify.py and the CLI module import nothing that opens a socket or a database, and verify offline."""
    script = f"""
import sys
for name in ("socket", "_socket", "ssl", "sqlite3", "_sqlite3", "asyncio", "http.client", "urllib.request"):
    sys.modules[name] = None
from pathlib import Path
import bastion.audit.verify
from bastion.cli.verify_cmd import run_verify, run_join
vectors = Path({str(VECTORS)!r})
bundle, claim = vectors / "bundle_valid.jsonl", vectors / "claim_valid.json"
code = run_verify(bundle, claim, vectors / "audit_pubkey.pem", jobs=1)
assert code == 0, code
assert run_join("exec-7f3a", [vectors / "bundle_valid.jsonl"]) == 0
loaded = [m for m in ("socket", "sqlite3", "ssl", "asyncio") if sys.modules.get(m) is not None]
assert not loaded, loaded
print("offline ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "offline ok" in result.stdout


def test_join_orders_records_by_time_then_bundle(
    keyring: Keyring, make_chain: Any, make_evidence: Any
) -> None:
    """Records sharing an execution id come back across bundles by ts, then bundle order, then line."""
    t = datetime(2026, 5, 1, tzinfo=UTC)
    later = make_evidence(
        keyring,
        make_chain(keyring.key_id, session_id="ev_b", start=t, execution_ids=("x", "other")),
        "later",
    )
    earlier = make_evidence(
        keyring,
        make_chain(keyring.key_id, session_id="ev_a", start=t, execution_ids=("x",), calls=2),
        "earlier",
    )
    records = list(join_execution([later.bundle_path, earlier.bundle_path], "x"))
    keys = [(r.entry.ts, r.entry.session_id, r.line) for r in records]
    assert keys == sorted(keys, key=lambda k: (k[0], 0 if k[1] == "ev_b" else 1, k[2]))
    assert [r.entry.session_id for r in records] == ["ev_b", "ev_a", "ev_a", "ev_b"]
    assert all(r.entry.execution_id == "x" for r in records)
    assert list(join_execution([later.bundle_path], "nobody")) == []


def test_join_refuses_a_tampered_bundle() -> None:
    """A join verifies every bundle it reads and names the bad one."""
    with pytest.raises(HashMismatch) as caught:
        list(join_execution([VECTORS / "bundle_valid.jsonl", VECTORS / "bundle_bad_hash.jsonl"], "exec-7f3a"))
    assert caught.value.source == str(VECTORS / "bundle_bad_hash.jsonl")


def _bundle_file(tmp_path: Path, keyring: Keyring, make_chain: Any, calls: int) -> Path:
    path = tmp_path / f"big-{calls}.jsonl"
    with open(path, "wb") as out:
        for entry in make_chain(keyring.key_id, calls=calls):
            out.write(entry_line(entry))
    return path


def test_memory_stays_flat_in_bundle_size(
    tmp_path: Path, keyring: Keyring, make_chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying ten times more entries does not take more memory (beyond one read block)."""
    monkeypatch.setattr(walk, "_BLOCK", 32 * 1024)
    peaks = []
    for calls in (300, 3000):
        path = _bundle_file(tmp_path, keyring, make_chain, calls)
        tracemalloc.start()
        try:
            verify_bundle_file(path, key=keyring.active)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] < peaks[0] * 1.5 + 64 * 1024, peaks


def test_a_forked_walk_agrees_with_one_process(
    tmp_path: Path, keyring: Keyring, make_chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split across processes, a bundle gives the same summary, and a late defect the same report."""
    monkeypatch.setattr(fanout, "_PARALLEL_MIN_BYTES", 0)
    assert threading.active_count() == 1
    path = _bundle_file(tmp_path, keyring, make_chain, 400)
    forked: list[Any] = []
    real = fanout._walk_forked
    monkeypatch.setattr(fanout, "_walk_forked", lambda *a: forked.append(real(*a)) or forked[-1])
    assert verify_bundle_file(path, key=keyring.active, jobs=3) == verify_bundle_file(
        path, key=keyring.active
    )
    assert forked and forked[0] is not None, "the forked walk was used and was clean"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[350] = lines[350].replace(b'"outcome":"completed"', b'"outcome":"failed"')
    path.write_bytes(b"".join(lines))
    with pytest.raises(HashMismatch) as caught:
        verify_bundle_file(path, key=keyring.active, jobs=3)
    assert (caught.value.line, caught.value.seq) == (351, 350)


def test_verify_chain_on_an_iterable(evidence: Any) -> None:
    """verify_chain accepts any iterable of lines, with or without newlines."""
    lines = evidence.bundle_path.read_bytes().splitlines()
    assert verify_chain(lines) == evidence.summary
