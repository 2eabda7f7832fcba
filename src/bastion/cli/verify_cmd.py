"""``bastion verify`` and ``bastion audit join``: offline evidence checks at the CLI edge (DESIGN section 4).

Pure functions that print and return an exit code; ``cli/main.py`` wires them
into argparse:

* ``bastion verify BUNDLE [--claim CLAIM | --integrity-only] --key PUBKEY`` -> :func:`run_verify`
* ``bastion audit join --execution-id ID [--agent A] BUNDLE...`` -> :func:`run_join`

Exit codes: 0 verified, 1 verification failure (the message names the line,
the seq and the defect), 2 usage or I/O error, 3 unauthenticated: the chain is
sound but no signed claim covers it (issue #11 point 9). Hashes alone prove
nothing about who wrote a bundle: anyone can rewrite an entry and recompute
every hash after it, or drop the close entry. Only the claim, signed by the
pinned key, authenticates the head, the count and the close. Without
``--claim`` the verdict is therefore ``UNAUTHENTICATED`` (exit 3) unless the
user asks for an integrity-only check with ``--integrity-only`` (exit 0, and
the output still says that nothing was authenticated). Like
``audit/verify.py``, this module imports nothing that opens a socket or a
database.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

from bastion.audit.errors import VerificationError
from bastion.audit.verify import JoinedRecord, join_execution, verify_bundle_file
from bastion.crypto.keys import KeyringError, VerifyingKey

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNAUTHENTICATED", "EXIT_USAGE", "run_join", "run_verify"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAUTHENTICATED = 3


def run_verify(
    bundle: Path,
    claim: Path | None,
    key: Path,
    *,
    jobs: int | None = None,
    integrity_only: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Verify ``bundle`` (and ``claim``) offline with the public key in ``key`` (PEM or JWK).

    ``jobs`` processes walk a large bundle (default: one per CPU); the verdict
    does not depend on it. Without ``claim``, a sound chain is reported
    unauthenticated (exit 3) unless ``integrity_only`` asks for just that check.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        verifying_key = VerifyingKey.load(key.read_bytes())
    except OSError as exc:
        print(f"error: cannot read key {key}: {exc.strerror or exc}", file=err)
        return EXIT_USAGE
    except KeyringError as exc:
        print(f"error: {key}: {exc}", file=err)
        return EXIT_USAGE
    try:
        summary = verify_bundle_file(
            bundle, key=verifying_key, claim=claim, jobs=jobs if jobs is not None else os.cpu_count() or 1
        )
    except VerificationError as exc:
        print(f"FAIL {exc}", file=out)
        return EXIT_FAILED
    except OSError as exc:
        print(f"error: cannot read {exc.filename or bundle}: {exc.strerror or exc}", file=err)
        return EXIT_USAGE
    if claim is None:
        verdict = "INTEGRITY OK" if integrity_only else "UNAUTHENTICATED"
        print(
            f"{verdict} {bundle}: {summary.entry_count} entries, evidence session {summary.session_id}",
            file=out,
        )
        print(
            "  not authenticated: no signed claim covers this bundle; its hashes link, but anyone can "
            "rewrite an entry and recompute them, or drop its tail (give --claim to authenticate)",
            file=out,
        )
    else:
        print(f"OK {bundle}: {summary.entry_count} entries, evidence session {summary.session_id}", file=out)
    print(f"  agent       {summary.agent}", file=out)
    print(f"  chain root  {summary.root}", file=out)
    print(f"  head        {summary.head}", file=out)
    print(f"  time        {summary.first_ts} .. {summary.last_ts}", file=out)
    print(f"  key id      {summary.key_id}", file=out)
    attestation = summary.attestation or {}
    print(f"  attestation {_attestation_line(attestation)}", file=out)
    closed = summary.close_reason.value if summary.close_reason is not None else "open (no session_close)"
    print(f"  closed      {closed}", file=out)
    if claim is not None:
        print(f"  claim       {claim}: signature and every stated fact verified", file=out)
        return EXIT_OK
    if summary.close_reason is None:
        print("  warning     no session_close entry: the bundle may have been cut short", file=out)
    return EXIT_OK if integrity_only else EXIT_UNAUTHENTICATED


def run_join(
    execution_id: str,
    bundles: list[Path],
    *,
    agent: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Print the entries across ``bundles`` that carry ``execution_id``, grouped by agent, by time.

    Each bundle's chain is verified while it is read. An execution id is scoped
    under its agent (DESIGN section 3), so records are grouped by ``(agent,
    execution_id)`` and two agents' records are never one execution; ``agent``
    keeps one group only. Within a group, sharing an asserted execution id does
    not make two records one logical operation: when their bindings differ, the
    output says so.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    if not execution_id:
        print("error: --execution-id must not be empty", file=err)
        return EXIT_USAGE
    if not bundles:
        print("error: name at least one bundle", file=err)
        return EXIT_USAGE
    try:
        records = list(join_execution(bundles, execution_id))
    except VerificationError as exc:
        print(f"FAIL {exc}", file=out)
        return EXIT_FAILED
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror or exc}", file=err)
        return EXIT_USAGE
    groups: dict[str | None, list[JoinedRecord]] = {}
    for record in records:
        if agent is None or record.entry.agent == agent:
            groups.setdefault(record.entry.agent, []).append(record)
    count = sum(len(group) for group in groups.values())
    sessions_all = {record.entry.session_id for group in groups.values() for record in group}
    print(
        f"{count} record(s) carry the asserted execution_id {execution_id!r} in {len(sessions_all)} "
        f"evidence session(s), under {len(groups)} agent(s); {len(bundles)} bundle(s) verified",
        file=out,
    )
    for owner, group in groups.items():
        sessions = {record.entry.session_id for record in group}
        print(
            f"agent {owner!r}, execution_id {execution_id!r}: {len(group)} record(s) "
            f"in {len(sessions)} evidence session(s)",
            file=out,
        )
        for record in group:
            entry = record.entry
            print(
                f"  {entry.ts}  agent={entry.agent} {record.bundle}:{record.line} seq={entry.seq} "
                f"session={entry.session_id} event={entry.event} call={entry.call_id} "
                f"outcome={entry.outcome} binding={entry.binding}",
                file=out,
            )
        bindings = {record.entry.binding for record in group if record.entry.binding is not None}
        if len(bindings) > 1:
            print(
                "  note: the bindings differ; these records share an asserted execution_id, "
                "not one logical operation",
                file=out,
            )
    if len(groups) > 1:
        print(
            "note: an execution_id is scoped under its agent; each agent's records above are a "
            "separate execution",
            file=out,
        )
    return EXIT_OK


def _attestation_line(attestation: dict[str, object]) -> str:
    if attestation.get("kind") == "none":
        return f"none ({attestation.get('reason')})"
    if attestation.get("kind"):
        return f"{attestation['kind']} provider={attestation.get('provider')} (report_data binds the root)"
    return "absent (genesis only)"
