"""The TRACE claim: conformant to TRACE v0.2, verified by the reference tools, never listing execution ids."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agentrust_trace import TrustRecord, validate_json, verify_record
from hypothesis import given
from hypothesis import strategies as st
from trace_tests.modules.unverified import finding_counts_as_level_failure
from trace_tests.runner import run as run_conformance

from bastion.audit.chain import ChainSummary, CloseReason
from bastion.audit.claim import (
    TRACE_PROFILE,
    ClaimProfile,
    PolicyInForce,
    agent_from_subject,
    agent_subject,
    build_claim,
    issue_claim,
    read_claim_facts,
)
from bastion.audit.errors import ClaimMalformed
from bastion.crypto.keys import Keyring

TRACE_TESTS = Path(sys.executable).with_name("trace-tests")


def test_claim_passes_the_trace_conformance_suite_cli(evidence: Any) -> None:
    """`trace-tests verify --level 0` passes on a claim file as exported."""
    result = subprocess.run(
        [str(TRACE_TESTS), "verify", "--record", str(evidence.claim_path), "--level", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Result: PASS" in result.stdout
    assert "TR-SIG  PASS        Ed25519 signature verified" in result.stdout


def test_claim_has_no_failing_conformance_finding(evidence: Any) -> None:
    """The suite's level-0 modules report no finding that counts as a failure, signature included."""
    findings = run_conformance(evidence.claim, "trace", 0)
    failing = [f for module in findings.values() for f in module if finding_counts_as_level_failure(f, 0)]
    assert failing == []
    assert any(f.code == "TR-SIG-005" and f.passed() for f in findings["TR-SIG"])


def test_claim_verifies_with_agentrust_trace(evidence: Any) -> None:
    """agentrust_trace.verify_record accepts the claim under the gateway's public JWK and PEM-loaded key."""
    result = verify_record(evidence.claim, evidence.keyring.active.to_jwk())
    assert result.profile == TRACE_PROFILE
    assert result.trusted_key_thumbprint == evidence.keyring.key_id
    validate_json(evidence.claim)
    TrustRecord.model_validate(evidence.claim)


def test_agentrust_trace_refuses_a_claim_under_another_key(evidence: Any, tmp_path: Path) -> None:
    """The reference verifier refuses the claim under another gateway's key."""
    other = Keyring.open(tmp_path / "other")
    with pytest.raises(ValueError, match=r"cnf\.jwk does not identify"):
        verify_record(evidence.claim, other.active.to_jwk())


def test_claim_never_lists_execution_ids(keyring: Keyring, make_chain: Any, make_evidence: Any) -> None:
    """Even when every call carries an execution id, no execution id value appears in the claim."""
    ids = ("exec-alpha-91", "exec-beta-17", "exec-gamma-33")
    ev = make_evidence(keyring, make_chain(keyring.key_id, execution_ids=ids))
    bundle = ev.bundle_path.read_bytes()
    claim = ev.claim_path.read_bytes()
    for value in ids:
        assert value.encode() in bundle
        assert value.encode() not in claim
    assert b"execution" not in claim


def test_claim_states_the_chain(evidence: Any) -> None:
    """Reading the claim back gives the chain's session, agent, root, head, count, times, key and reason."""
    facts = read_claim_facts(evidence.claim)
    summary = evidence.summary
    assert (facts.session_id, facts.agent, facts.root, facts.head) == (
        summary.session_id,
        summary.agent,
        summary.root,
        summary.head,
    )
    assert (facts.entry_count, facts.first_ts, facts.last_ts) == (6, summary.first_ts, summary.last_ts)
    assert facts.key_id == evidence.keyring.key_id
    assert facts.close_reason is CloseReason.IDLE_EXPIRY
    assert facts.transcript_hash == "sha256:" + summary.head
    assert evidence.claim["runtime"]["platform"] == "software-only"


@given(st.text(min_size=1))
def test_any_agent_round_trips_through_the_subject(agent: str) -> None:
    """Every agent string maps to a SPIFFE subject and back, one to one."""
    try:
        agent.encode("utf-8")
    except UnicodeEncodeError:
        return
    subject = agent_subject("bastion.test", agent)
    assert agent_from_subject(subject) == agent
    assert subject.startswith("spiffe://bastion.test/agent/")


def test_encoded_prefix_cannot_alias_another_agent() -> None:
    """An agent named like an encoded segment is itself encoded: no two agents share a subject."""
    assert agent_subject("t", "b64.YQ") != agent_subject("t", "a")
    assert agent_from_subject(agent_subject("t", "b64.YQ")) == "b64.YQ"
    for subject in (
        "spiffe://t/agent/b64.YQ==",
        "spiffe://t/agent/b64.YWdlbnQ",
        "spiffe://t/agent/..",
        "did:x:y",
    ):
        if subject == "spiffe://t/agent/b64.YWdlbnQ":
            with pytest.raises(ValueError, match="non-canonical"):
                agent_from_subject(subject)
        else:
            with pytest.raises(ValueError):
                agent_from_subject(subject)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"trust_domain": "Bad Domain"},
        {"issuer": "not a uri"},
        {"issuer": "relative/path"},
        {"build_digest": "md5:00"},
        {"slsa_level": 4},
        {"data_class": ""},
        {"enforcement_mode": "declared"},
    ],
)
def test_profile_refuses_what_the_schema_would(kwargs: dict[str, Any]) -> None:
    """A profile value the TRACE schema would refuse is refused when the profile is built."""
    base: dict[str, Any] = {
        "trust_domain": "bastion.test",
        "issuer": "spiffe://bastion.test/gateway",
        "build_digest": "sha256:" + "ab" * 32,
    }
    with pytest.raises(ValueError):
        ClaimProfile(**{**base, **kwargs})
    with pytest.raises(ValueError):
        PolicyInForce(bundle_hash="sha1:00")


def test_claims_are_issued_for_closed_chains_by_their_key(evidence: Any, tmp_path: Path) -> None:
    """An open chain gets no claim, and a key other than the genesis key does not sign one."""
    profile = ClaimProfile(trust_domain="t", issuer="spiffe://t/g", build_digest="sha256:" + "ab" * 32)
    policy = PolicyInForce(bundle_hash="sha256:" + "cd" * 32)
    now = datetime.now(UTC)
    open_summary = ChainSummary.of(evidence.entries[0], evidence.entries[1], evidence.entries[-2])
    with pytest.raises(ValueError, match="closed"):
        build_claim(open_summary, profile=profile, policy=policy, issued_at=now)
    other = Keyring.open(tmp_path / "other")
    with pytest.raises(ValueError, match="opened under key"):
        issue_claim(evidence.summary, profile=profile, policy=policy, keyring=other, issued_at=now)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda c: [1],
        lambda c: {**c, "extra": 1},
        lambda c: {**c, "eat_profile": "tag:agentrust.io,2026:trace-v0.1"},
        lambda c: {**c, "iat": 5},
        lambda c: {**c, "references": {}},
        lambda c: {**c, "references": c["references"][:-1]},
        lambda c: {**c, "references": [*c["references"], c["references"][0]]},
        lambda c: {**c, "references": [*c["references"][:-1], {**c["references"][-1], "rel": "x:y"}]},
        lambda c: {**c, "references": [{**c["references"][0], "id": ""}, *c["references"][1:]]},
        lambda c: {
            **c,
            "references": [
                c["references"][0],
                {**c["references"][1], "digest": "sha384:00"},
                *c["references"][2:],
            ],
        },
        lambda c: {
            **c,
            "references": [*c["references"][:2], {**c["references"][2], "id": "ev#01"}, *c["references"][3:]],
        },
        lambda c: {
            **c,
            "references": [
                *c["references"][:4],
                {**c["references"][4], "id": "yesterday"},
                c["references"][5],
            ],
        },
        lambda c: {**c, "references": [*c["references"][:5], {**c["references"][5], "id": "tired"}]},
        lambda c: {**c, "tool_transcript": {"hash": c["tool_transcript"]["hash"], "call_count": 1}},
        lambda c: {**c, "subject": "spiffe://t/workload/x"},
        lambda c: {**c, "cnf": {"jwk": {}}},
    ],
)
def test_claims_of_another_shape_are_malformed(evidence: Any, tamper: Any) -> None:
    """Anything but the exact shape Bastion issues raises ClaimMalformed when read."""
    with pytest.raises(ClaimMalformed):
        read_claim_facts(tamper(evidence.claim))
