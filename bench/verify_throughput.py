"""How fast ``bastion verify`` checks a bundle on one core (DESIGN section 10: >= 200,000 entries/s).

Usage::

    .venv/bin/python bench/verify_throughput.py [--entries 100000 1000000] [--bastion-cmd CMD] [--cpu 0]

Writes one closed chain per ``--entries`` size (realistic entries, about 700
bytes a line) and runs the real CLI on each, ``bastion verify BUNDLE --key
PUB --integrity-only --jobs 1``, pinned to one CPU (``taskset``, or
``sched_setaffinity`` before it execs). For each size it reports the wall time and the child's
peak resident set size (``ru_maxrss`` from ``wait4``), so "memory flat in the
bundle's size" can be read off directly. The rate is taken between the two
largest sizes, ``(n_big - n_small) / (t_big - t_small)``, which cancels the
interpreter's start-up, with ``t`` the child's CPU time (user + system, from
``wait4``): on a shared machine that is what one core gives the verifier,
whatever else runs. The same rate in wall-clock time is reported beside it.
It asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bastion.audit.chain import CloseReason, attestation_entry, close_entry, make_genesis
from bastion.audit.entry import AuditEntry, AuditEvent, format_ts
from bastion.audit.export import entry_line
from bastion.audit.tee import no_attestation
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


TARGET_RATE = 200_000
FLAT_RSS_GROWTH = 0.25  # peak RSS of the largest bundle at most 25% above the smallest's


_PIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); os.execvp(sys.argv[2], sys.argv[2:])"


def bastion_argv(bastion_cmd: str | None) -> list[str]:
    """The bastion CLI: ``bastion_cmd``, else the script next to this Python."""
    if bastion_cmd:
        return shlex.split(bastion_cmd)
    script = Path(sys.executable).with_name("bastion")
    return [str(script)] if script.exists() else [shutil.which("bastion") or "bastion"]


def verify_once(argv: list[str], bundle: Path, key: Path, cpu: int) -> tuple[float, float, int]:
    """Run ``bastion verify`` pinned to ``cpu``: wall seconds, CPU seconds, peak RSS in bytes."""
    # Pinned by a small program that then execs bastion: a preexec_fn would fork this whole
    # interpreter first, and its pages would count in the child's peak RSS.
    taskset = shutil.which("taskset")
    pin = [taskset, "-c", str(cpu)] if taskset else [sys.executable, "-c", _PIN, str(cpu)]
    started = time.perf_counter()
    process = subprocess.Popen(
        [*pin, *argv, "verify", str(bundle), "--key", str(key), "--integrity-only", "--jobs", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    output = process.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"bastion verify exited {process.returncode}: {output.strip()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def measure_verify(
    sizes: Sequence[int], *, bastion_cmd: str | None = None, cpu: int | None = None
) -> dict[str, Any]:
    """Write a bundle of each size and verify it with the CLI on one CPU; rates and peak RSS."""
    sizes = sorted(set(sizes))
    cpu = cpu if cpu is not None else min(os.sched_getaffinity(0))
    argv = bastion_argv(bastion_cmd)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        keyring = Keyring.open(Path(work) / "data")
        key = Path(work) / "key.pem"
        key.write_bytes(keyring.active.to_pem())
        for size in sizes:
            bundle = Path(work) / f"bundle-{size}.jsonl"
            write_bundle(bundle, size, keyring.key_id)
            wall, cpu_s, peak = verify_once(argv, bundle, key, cpu)
            runs.append(
                {
                    "entries": size,
                    "bundle_bytes": bundle.stat().st_size,
                    "wall_s": round(wall, 3),
                    "cpu_s": round(cpu_s, 3),
                    "entries_per_s_raw": round(size / wall),
                    "peak_rss_bytes": peak,
                }
            )
            bundle.unlink()
    rate = _rate(runs, "cpu_s")
    growth = runs[-1]["peak_rss_bytes"] / runs[0]["peak_rss_bytes"] - 1
    return {
        "cpu": cpu,
        "runs": runs,
        "entries_per_s": round(rate),
        "entries_per_wall_s": round(_rate(runs, "wall_s")),
        "meets_rate": rate >= TARGET_RATE,
        "peak_rss_growth_ratio": round(growth, 4),
        "memory_flat": growth <= FLAT_RSS_GROWTH,
    }


def _rate(runs: list[dict[str, Any]], clock: str) -> float:
    """Entries per second of ``clock`` between the two largest runs (start-up cancels), else the largest."""
    big = runs[-1]
    if len(runs) > 1 and big[clock] > runs[-2][clock]:
        small = runs[-2]
        return float((big["entries"] - small["entries"]) / (big[clock] - small[clock]))
    return float(big["entries"] / big[clock]) if big[clock] else float("nan")


def describe(result: dict[str, Any]) -> str:
    lines = [
        f"{run['entries']:>10,} entries ({run['bundle_bytes'] / 2**20:,.0f} MiB): {run['wall_s']:.2f}s wall, "
        f"{run['cpu_s']:.2f}s CPU, peak RSS {run['peak_rss_bytes'] / 2**20:.1f} MiB"
        for run in result["runs"]
    ]
    lines.append(
        f"one core (cpu {result['cpu']}): {result['entries_per_s']:,} entries per CPU second "
        f"({result['entries_per_wall_s']:,} per wall second; target >= {TARGET_RATE:,}); "
        f"peak RSS {result['peak_rss_growth_ratio']:+.1%} from smallest to largest bundle"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, nargs="+", default=[100_000, 1_000_000], help="bundle sizes")
    parser.add_argument("--bastion-cmd", help="command that runs the bastion CLI (default: the venv's)")
    parser.add_argument(
        "--cpu", type=int, help="the CPU to pin to (default: the lowest this process may use)"
    )
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if min(args.entries) < 3:
        parser.error("a closed chain has at least 3 entries")
    result = measure_verify(args.entries, bastion_cmd=args.bastion_cmd, cpu=args.cpu)
    print(describe(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
