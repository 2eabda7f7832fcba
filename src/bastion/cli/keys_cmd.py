"""``bastion verify-keys``: follow a gateway's key rotations from a pinned key, offline (issue #11 point 15).

``bastion verify-keys bastion-keys.json --key pinned.pem [--out DIR]`` checks
that the key set (from ``/.well-known/bastion-keys.json``) is signed by the
pinned key and lists the keys it vouches for; with ``--out`` it writes each as
``DIR/<kid>.pem``, ready for ``bastion verify --key``. A gateway re-signs the
set at rotation with the new key and the previous one, so pinning any key the
gateway has used lets a verifier reach the current one, one rotation at a time.

Exit codes: 0 verified, 1 not signed by the pinned key (or malformed), 2 usage
or I/O error. Offline: nothing here opens a socket or a database.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from bastion.crypto.key_set import InvalidKeySet, verify_key_set
from bastion.crypto.keys import KeyringError, VerifyingKey

__all__ = ["run_verify_keys"]


def run_verify_keys(
    document: Path,
    key: Path,
    *,
    out_dir: Path | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Verify ``document`` against the pinned ``key``; 0, 1 (not vouched for) or 2 (usage, I/O)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        pinned = VerifyingKey.load(key.read_bytes())
        data = json.loads(document.read_bytes())
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror or exc}", file=err)
        return 2
    except (KeyringError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    try:
        keys = verify_key_set(data, pinned)
    except InvalidKeySet as exc:
        print(f"FAIL {document}: {exc}", file=out)
        return 1
    print(f"OK {document}: signed by the pinned key {pinned.key_id}; {len(keys)} key(s)", file=out)
    for listed in keys:
        status = "active" if listed.key_id == data["active"] else "retired"
        print(f"  {listed.key_id}  {status}", file=out)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"{listed.key_id}.pem").write_bytes(listed.to_pem())
    return 0
