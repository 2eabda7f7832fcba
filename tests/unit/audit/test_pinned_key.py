"""Why a verifier pins the key (issue #11 point 15): trace-tests Level 0 trusts the key a claim embeds."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

from bastion.audit.export import claim_bytes
from bastion.audit.verify import parse_unverified_claim
from bastion.cli.verify_cmd import EXIT_FAILED, run_verify
from bastion.crypto.keys import Keyring
from bastion.crypto.sign import sign_claim

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
TRACE_TESTS = Path(sys.executable).with_name("trace-tests")


def test_a_claim_re_signed_with_another_key_passes_level_0_and_fails_the_pinned_key(tmp_path: Path) -> None:
    """A re-signed claim passes `trace-tests --level 0`; `bastion verify` with the pinned key rejects it."""
    claim = parse_unverified_claim((VECTORS / "claim_valid.json").read_bytes())
    unsigned = {k: v for k, v in claim.items() if k not in ("signature", "cnf")}
    forged = sign_claim({**unsigned, "iat": int(time.time())}, Keyring.open(tmp_path / "forger"))
    path = tmp_path / "forged.json"
    path.write_bytes(claim_bytes(forged))
    level0 = subprocess.run(
        [str(TRACE_TESTS), "verify", "--record", str(path), "--level", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert level0.returncode == 0, level0.stdout + level0.stderr
    out, err = io.StringIO(), io.StringIO()
    code = run_verify(
        VECTORS / "bundle_valid.jsonl", path, VECTORS / "audit_pubkey.pem", jobs=1, out=out, err=err
    )
    assert code == EXIT_FAILED
    assert "claim_signature_invalid" in out.getvalue()
