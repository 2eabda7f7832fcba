"""How fast ``bastion verify`` checks a bundle (DESIGN section 10: >= 200,000 entries/s, streaming).

Usage::

    .venv/bin/python bench/verify_throughput.py [--entries 1000000] [--jobs 1 2] [--keep PATH]

Writes a closed chain of ``--entries`` realistic entries (about 700 bytes a
line) to a temporary bundle, then verifies it once per ``--jobs`` value and
prints entries per second, wall clock and this process's CPU time. Prints
ratios and rates only; it asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bastion.audit.chain import CloseReason, attestation_entry, close_entry, make_genesis
from bastion.audit.entry import AuditEntry, AuditEvent, format_ts
from bastion.audit.export import entry_line
from bastion.audit.tee import no_attestation
from bastion.audit.verify import verify_bundle_file
from bastion.crypto.jcs import canonical_json
from bastion.crypto.keys import Keyring


def write_bundle(path: Path, entries: int, key_id: str) -> None:
    """A closed chain of ``entries`` entries; the middle is hashed with the same JCS bytes, faster."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    genesis = make_genesis(session_id="ev_" + "a" * 32, agent="agent-bench", key_id=key_id, at=t0)
    attestation = attestation_entry(genesis, no_attestation("benchmark"), at=t0)
    with open(path, "wb") as out:
        out.write(entry_line(genesis))
        out.write(entry_line(attestation))
        body = attestation.body()
        prev = attestation.hash
        assert prev is not None
        for seq in range(2, entries - 1):
            body.update(
                seq=seq,
                ts=format_ts(t0 + timedelta(microseconds=seq)),
                call_id=f"call_{seq:024x}",
                workflow_id="wf-orders",
                execution_id=f"exec-{seq // 3:08d}",
                event=AuditEvent.COMPLETED.value,
                server="files",
                tool="read_file",
                args_digest="sha256:" + "c" * 64,
                binding="d" * 64,
                decision="allow",
                outcome="completed",
                policy_version="v12",
                worker="gw-20260101T000000Z-abc1234",
                epoch=3,
                detail=None,
                prev=prev,
            )
            digest = hashlib.sha256(bytes.fromhex(prev))
            digest.update(canonical_json(body))
            prev = digest.hexdigest()
            out.write(canonical_json({**body, "hash": prev}) + b"\n")
        last = AuditEntry(**{**body, "hash": prev})
        out.write(entry_line(close_entry(last, CloseReason.SHUTDOWN, at=t0 + timedelta(seconds=9))))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--keep", type=Path, help="write the bundle here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        keyring = Keyring.open(Path(work) / "data")
        path = args.keep or Path(work) / "bundle.jsonl"
        started = time.perf_counter()
        write_bundle(path, args.entries, keyring.key_id)
        size = path.stat().st_size
        took = time.perf_counter() - started
        print(f"wrote {args.entries:,} entries ({size / 2**20:,.0f} MiB) in {took:.1f}s")
        for jobs in args.jobs:
            wall, cpu = time.perf_counter(), time.process_time()
            summary = verify_bundle_file(path, key=keyring.active, jobs=jobs)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert summary.entry_count == args.entries
            print(
                f"jobs={jobs}: {args.entries / wall:,.0f} entries/s "
                f"(wall {wall:.2f}s, this process's CPU {cpu:.2f}s, {size / wall / 2**20:,.0f} MiB/s)"
            )


if __name__ == "__main__":
    main()
