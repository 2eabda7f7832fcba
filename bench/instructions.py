"""Governed calls for an instruction count (issue #13): deterministic where wall-clock CPU is noise.

    valgrind --tool=callgrind python bench/instructions.py --upstream-port P --mode legacy --calls 120
    valgrind --tool=callgrind python bench/instructions.py --upstream-port P --mode legacy --calls 20
    (same two with --direct: the client alone, straight to the upstream)

Drives ``calls`` calls of one session at concurrency 1 (execution ids on) through a gateway built
in this process as ``bastion serve`` builds it (its own temporary data directory, SQLite), against
an upstream already running on ``--upstream-port`` (``python -m bastion.examples.tools_server
--port P``, outside valgrind). Bastion's instructions per call are
``(I(120) - I(20)) / 100`` through, minus the same difference ``--direct``: start-up and the
client cancel out. Another build is measured by running this file with its ``src`` first on
``PYTHONPATH``. Prints the calls made and failed, and how long the calls took (``phase_s``);
exit status 1 when any failed.

The gateway's timed loops (the change feed every 0.25 s, store probes, sweeps) run by the
clock, not per call: idle, the gateway runs about 3.3 M instructions a second under
callgrind (issue 28), and on a loaded machine 100 calls take anywhere from 10 s to 60 s
there, so the difference above counts 0.3 M to 2 M per call of that work, more than most
cuts. ``--idle-s S`` keeps the gateway serving, idle, for ``S`` seconds after the calls:
``(I(20, idle S) - I(20)) / S`` is that background's rate, and the per-call figure is
``(I(120) - I(20) - rate * (phase_s(120) - phase_s(20))) / 100``. The rate itself falls
when the machine starves the loop (timers coalesce), so compare runs of similar ``phase_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import repo_path  # noqa: F401  (puts the repository root on sys.path: tests.support)
from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from loadgen import Mode, Target, run_phase
from tests.support.loopback import serve_on_loopback

_TOKEN = "instructions-bench-token-" + "x" * 20


async def drive(port: int, mode: Mode, calls: int, direct: bool, idle_s: float = 0.0) -> int:
    upstream = f"http://127.0.0.1:{port}/mcp"
    if direct:
        target = Target("direct", upstream, "echo", headers={}, execution_ids=False)
        phase = await run_phase(target, mode, sessions=1, warmup_calls=5, calls=calls, timeout_s=600.0)
        print(f"calls {phase.calls} errors {phase.errors}", file=sys.stderr)
        return phase.errors
    config = {
        "servers": {"tools": {"url": upstream}},
        "agents": {"bench": {"token_sha256": hashlib.sha256(_TOKEN.encode()).hexdigest()}},
    }
    snapshot = snapshot_from_mapping(config, source=None, version="instructions")
    with tempfile.TemporaryDirectory() as data:
        options = RuntimeOptions(data_dir=Path(data), store_url=None, generation="instructions")
        # Under valgrind a start takes minutes on a loaded machine: a bound far above the default.
        async with serve_on_loopback(create_app(snapshot, options), startup_timeout_s=900.0) as url:
            target = Target(
                "through",
                url,
                "tools__echo",
                headers={"authorization": f"Bearer {_TOKEN}"},
                execution_ids=True,
            )
            # A generous bound: under valgrind every call is about fifty times slower.
            started = time.monotonic()
            phase = await run_phase(target, mode, sessions=1, warmup_calls=5, calls=calls, timeout_s=600.0)
            phase_s = time.monotonic() - started
            await asyncio.sleep(idle_s)  # the timed loops alone, for their rate (module docstring)
    print(f"calls {phase.calls} errors {phase.errors} phase_s {phase_s:.3f}", file=sys.stderr)
    return phase.errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--mode", choices=["legacy", "modern"], default="legacy")
    parser.add_argument("--calls", type=int, default=120)
    parser.add_argument("--direct", action="store_true", help="the client straight to the upstream")
    parser.add_argument("--idle-s", type=float, default=0.0, help="serve idle this long after the calls")
    args = parser.parse_args()
    errors = asyncio.run(drive(args.upstream_port, args.mode, args.calls, args.direct, args.idle_s))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
