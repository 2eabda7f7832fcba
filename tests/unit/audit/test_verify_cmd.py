"""`bastion verify` and `bastion audit join` as functions: exit codes 0, 1, 2 and what they print."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from bastion.cli.verify_cmd import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run_join, run_verify

VECTORS = Path(__file__).resolve().parents[2] / "vectors"


def _run_verify(bundle: str, claim: str | None, key: str = "audit_pubkey.pem") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_verify(
        VECTORS / bundle, VECTORS / claim if claim else None, VECTORS / key, jobs=1, out=out, err=err
    )
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("key", ["audit_pubkey.pem", "audit_pubkey.jwk.json"])
def test_a_valid_bundle_and_claim_exit_0(key: str) -> None:
    """A verified bundle and claim exit 0 and print the session's facts."""
    code, out, err = _run_verify("bundle_valid.jsonl", "claim_valid.json", key)
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith("OK ")
    assert "7 entries" in out and "client_delete" in out and "claim_valid.json" in out


def test_a_defect_exits_1_naming_line_seq_and_defect() -> None:
    """A tampered bundle exits 1 with a message naming the line, the seq and the defect."""
    code, out, _ = _run_verify("bundle_broken_link.jsonl", None)
    assert code == EXIT_FAILED
    assert "line 4 (seq 3): broken_link" in out


def test_a_claim_defect_exits_1() -> None:
    """A claim signed by another key exits 1."""
    code, out, _ = _run_verify("bundle_valid.jsonl", "claim_wrong_key.json")
    assert code == EXIT_FAILED and "claim_signature_invalid" in out


def test_the_wrong_key_exits_1() -> None:
    """A bundle checked against another gateway's key exits 1."""
    code, out, _ = _run_verify("bundle_valid.jsonl", None, "audit_other_pubkey.pem")
    assert code == EXIT_FAILED and "key_mismatch" in out


@pytest.mark.parametrize(
    ("bundle", "claim", "key"),
    [
        ("missing.jsonl", None, "audit_pubkey.pem"),
        ("bundle_valid.jsonl", "missing.json", "audit_pubkey.pem"),
        ("bundle_valid.jsonl", None, "missing.pem"),
        ("bundle_valid.jsonl", None, "bundle_valid.jsonl"),
    ],
)
def test_io_and_usage_errors_exit_2(bundle: str, claim: str | None, key: str) -> None:
    """A missing bundle, claim or key file, or a key file that is no key, exits 2 on stderr."""
    code, out, err = _run_verify(bundle, claim, key)
    assert code == EXIT_USAGE
    assert out == "" and err.startswith("error: ")


def test_join_prints_the_shared_records() -> None:
    """A join prints each record sharing the asserted execution id, oldest first, and exits 0."""
    out, err = io.StringIO(), io.StringIO()
    assert run_join("exec-7f3a", [VECTORS / "bundle_valid.jsonl"], out=out, err=err) == EXIT_OK
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("3 record(s) carry the asserted execution_id 'exec-7f3a'")
    assert lines[1].startswith("agent 'agent-alice', execution_id 'exec-7f3a': 3 record(s)")
    assert [line.split()[0] for line in lines[2:5]] == sorted(line.split()[0] for line in lines[2:5])
    assert "bundle_valid.jsonl:3" in lines[2] and "agent=agent-alice" in lines[2]


def test_join_fails_on_a_bad_bundle_and_on_usage() -> None:
    """A tampered bundle exits 1; no bundles, an empty id or a missing file exit 2."""
    out, err = io.StringIO(), io.StringIO()
    assert run_join("exec-7f3a", [VECTORS / "bundle_bad_hash.jsonl"], out=out, err=err) == EXIT_FAILED
    assert "line 5 (seq 4): hash_mismatch" in out.getvalue()
    assert run_join("exec-7f3a", [], out=out, err=err) == EXIT_USAGE
    assert run_join("", [VECTORS / "bundle_valid.jsonl"], out=out, err=err) == EXIT_USAGE
    assert run_join("x", [VECTORS / "nope.jsonl"], out=out, err=err) == EXIT_USAGE
