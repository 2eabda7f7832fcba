"""`bastion verify` and `bastion audit join` through the real entry point (issue #11 points 9 and 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.cli.main import main
from bastion.cli.verify_cmd import EXIT_FAILED, EXIT_OK, EXIT_UNAUTHENTICATED

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
KEY = str(VECTORS / "audit_pubkey.pem")


def _verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["verify", *args, "--key", KEY, "--jobs", "1"])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    "bundle", ["bundle_valid.jsonl", "bundle_rewritten_rehashed.jsonl", "bundle_close_dropped.jsonl"]
)
def test_without_a_claim_a_sound_chain_is_reported_unauthenticated(
    capsys: pytest.CaptureFixture[str], bundle: str
) -> None:
    """Without --claim, even a sound chain exits 3 and says that nothing was authenticated, never OK."""
    code, out = _verify(capsys, str(VECTORS / bundle))
    assert code == EXIT_UNAUTHENTICATED
    assert out.startswith("UNAUTHENTICATED ") and "not authenticated" in out
    assert not out.startswith("OK")


@pytest.mark.parametrize(
    ("bundle", "shown"),
    [("bundle_rewritten_rehashed.jsonl", "head hash"), ("bundle_close_dropped.jsonl", "session_close")],
)
def test_with_the_claim_a_rewritten_or_truncated_bundle_fails(
    capsys: pytest.CaptureFixture[str], bundle: str, shown: str
) -> None:
    """A bundle rewritten with recomputed hashes, or without its close entry, fails against its claim."""
    code, out = _verify(capsys, str(VECTORS / bundle), "--claim", str(VECTORS / "claim_valid.json"))
    assert code == EXIT_FAILED
    assert out.startswith("FAIL ") and "claim_mismatch" in out and shown in out


def test_integrity_only_is_asked_for_and_still_says_unauthenticated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--integrity-only exits 0 on a sound chain, says it is unauthenticated, and warns of a missing close."""
    code, out = _verify(capsys, str(VECTORS / "bundle_close_dropped.jsonl"), "--integrity-only")
    assert code == EXIT_OK
    assert out.startswith("INTEGRITY OK ") and "not authenticated" in out
    assert "no session_close entry" in out


def test_integrity_only_still_fails_a_broken_chain(capsys: pytest.CaptureFixture[str]) -> None:
    """--integrity-only does not weaken the chain checks: a broken link exits 1."""
    code, out = _verify(capsys, str(VECTORS / "bundle_broken_link.jsonl"), "--integrity-only")
    assert code == EXIT_FAILED and "broken_link" in out


def test_integrity_only_and_a_claim_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    """Asking for both an integrity-only check and a claim check is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "verify",
                str(VECTORS / "bundle_valid.jsonl"),
                "--claim",
                "c.json",
                "--integrity-only",
                "--key",
                KEY,
            ]
        )
    assert exited.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_a_valid_bundle_and_claim_print_ok(capsys: pytest.CaptureFixture[str]) -> None:
    """With its claim, the valid bundle exits 0 with OK."""
    code, out = _verify(
        capsys, str(VECTORS / "bundle_valid.jsonl"), "--claim", str(VECTORS / "claim_valid.json")
    )
    assert code == EXIT_OK and out.startswith("OK ")


def test_join_never_merges_two_agents_sharing_an_execution_id(capsys: pytest.CaptureFixture[str]) -> None:
    """Two agents asserting one execution_id are two groups, each line shows its agent, no binding note."""
    bundles = [str(VECTORS / "bundle_valid.jsonl"), str(VECTORS / "bundle_other_agent_same_execution.jsonl")]
    assert main(["audit", "join", "--execution-id", "exec-7f3a", *bundles]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(
        "4 record(s) carry the asserted execution_id 'exec-7f3a' in 2 evidence session(s), under 2 agent(s)"
    )
    assert "agent 'agent-alice', execution_id 'exec-7f3a': 3 record(s)" in out
    assert "agent 'agent-bob', execution_id 'exec-7f3a': 1 record(s)" in out
    records = [line for line in out.splitlines() if line.startswith("  20")]
    assert len(records) == 4 and all(" agent=agent-" in line for line in records)
    # Alice's records share one binding; Bob's differs, but that is another execution, not a collision.
    assert "bindings differ" not in out
    alice_block = out.split("agent 'agent-bob'")[0]
    assert "agent=agent-bob" not in alice_block


def test_join_keeps_one_agent_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """--agent keeps that agent's records only."""
    bundles = [str(VECTORS / "bundle_valid.jsonl"), str(VECTORS / "bundle_other_agent_same_execution.jsonl")]
    assert main(["audit", "join", "--execution-id", "exec-7f3a", "--agent", "agent-bob", *bundles]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("1 record(s)") and "agent-alice" not in out
