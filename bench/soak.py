"""Bastion's memory over a soak at full load (DESIGN section 10: flat over 10 minutes), loopback only.

    .venv/bin/python bench/soak.py [--duration 600] [--sample-every 10] [--sessions 16] [--bastion-cmd CMD]

Starts the example upstream and ``bastion serve`` on loopback, then keeps
``--sessions`` session-era sessions calling the echo tool back to back (every
call with a fresh execution id: every protection on) for ``--duration``
seconds, reading the gateway's resident set size (VmRSS of the process and
its descendants) every ``--sample-every`` seconds. Bounded: the load stops at
the deadline, and each call has its own timeout.

Flat means: the highest RSS of the last quarter of the run is at most
``FLAT_GROWTH`` (10%) above the highest RSS of the first quarter, the warm-up
in which pools and caches fill. A leak of a few hundred bytes a call shows up
as a steady climb well past that over ten minutes at full load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from loadgen import CallError, McpSession, Mode, Target
from procs import rss_bytes
from stack import running_stack

__all__ = ["FLAT_GROWTH", "run_soak"]

FLAT_GROWTH = 0.10
_MIB = 1 << 20


async def _load(
    target: Target, mode: Mode, sessions: int, seconds: float, sample_every: float, pid: int
) -> Any:
    calls = errors = 0
    first_error: str | None = None
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    deadline = started + seconds

    async def one_session() -> None:
        nonlocal calls, errors, first_error
        session = McpSession(target, mode, timeout_s=30.0)
        try:
            await session.open()
            while time.monotonic() < deadline:
                try:
                    await session.call_echo("x" * 32)
                    calls += 1
                except (CallError, httpx.HTTPError) as exc:
                    errors += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
        finally:
            await session.close()

    async def sampler() -> None:
        while True:
            samples.append((round(time.monotonic() - started, 2), rss_bytes(pid)))
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(sample_every, max(0.0, deadline - time.monotonic())))

    async with asyncio.TaskGroup() as group:
        group.create_task(sampler())
        for _ in range(sessions):
            group.create_task(one_session())
    return calls, errors, first_error, samples, time.monotonic() - started


def flatness(samples: list[tuple[float, int]], duration_s: float) -> dict[str, Any]:
    """The first quarter's highest RSS against the last quarter's, and whether it stayed flat."""
    quarter = duration_s / 4
    first = [rss for t, rss in samples if t <= quarter] or [samples[0][1]]
    last = [rss for t, rss in samples if t >= duration_s - quarter] or [samples[-1][1]]
    warm, end = max(first), max(last)
    growth = (end - warm) / warm if warm else float("nan")
    return {
        "warm_rss_bytes": warm,
        "end_rss_bytes": end,
        "growth_ratio": round(growth, 4),
        "flat": growth <= FLAT_GROWTH,
    }


def run_soak(
    duration_s: float,
    *,
    sample_every_s: float = 10.0,
    sessions: int = 16,
    mode: Mode = "legacy",
    bastion_cmd: str | None = None,
) -> dict[str, Any]:
    """Soak a fresh ``bastion serve`` at full load for ``duration_s``; RSS samples and the verdict."""
    temp = Path(tempfile.mkdtemp(prefix="bastion-soak-"))
    try:
        with running_stack(temp, bastion_cmd=bastion_cmd, execution_ids=True) as stack:
            calls, errors, first_error, samples, took = asyncio.run(
                _load(stack.target, mode, sessions, duration_s, sample_every_s, stack.bastion.pid)
            )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return {
        "duration_s": round(took, 1),
        "mode": mode,
        "sessions": sessions,
        "calls": calls,
        "errors": errors,
        "first_error": first_error,
        "calls_per_s": round(calls / took, 1) if took else float("nan"),
        "rss_samples": [{"t_s": t, "rss_bytes": rss} for t, rss in samples],
        **flatness(samples, took),
    }


def describe(result: dict[str, Any]) -> str:
    series = ", ".join(f"{s['t_s']:.0f}s {s['rss_bytes'] / _MIB:.0f}" for s in result["rss_samples"])
    return (
        f"soak {result['duration_s']:.0f}s, {result['calls']:,} calls ({result['calls_per_s']:.0f}/s, "
        f"{result['errors']} errors): RSS {result['warm_rss_bytes'] / _MIB:.1f} MiB (first quarter) -> "
        f"{result['end_rss_bytes'] / _MIB:.1f} MiB (last quarter), {result['growth_ratio']:+.1%}"
        f"\nRSS MiB over time: {series}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (600)")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions (16)")
    parser.add_argument("--mode", choices=["legacy", "modern"], default="legacy", help="client protocol era")
    parser.add_argument("--bastion-cmd", help="command that runs the bastion CLI (default: the venv's)")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    result = run_soak(
        args.duration,
        sample_every_s=args.sample_every,
        sessions=args.sessions,
        mode=args.mode,
        bastion_cmd=args.bastion_cmd,
    )
    print(describe(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
