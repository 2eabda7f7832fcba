"""What idle session-era client sessions cost Bastion in memory (DESIGN section 10: 10,000 in <= 1 GiB).

    .venv/bin/python bench/idle_sessions.py [--sessions 10000] [--bastion-cmd CMD] [--time-limit 600]

Starts the example upstream and ``bastion serve`` on loopback, warms the
gateway up with a few calls, reads its resident set size (VmRSS of the
process and its descendants), then opens ``--sessions`` real session-era
client sessions (``initialize``, then ``notifications/initialized``; each
keeps its ``Mcp-Session-Id`` and sends nothing more) over a few kept-alive
connections, and reads the RSS again once they are all open. Bounded: it
stops opening at ``--time-limit`` seconds and reports how many it opened. The
resident size at 10,000 sessions is the one measured when it opened 10,000,
else an extrapolation from the per-session cost (marked as such).
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

from loadgen import CallError, McpSession, lean_client
from procs import rss_bytes
from stack import running_stack

__all__ = ["TARGET_RSS_BYTES", "TARGET_SESSIONS", "measure_idle_sessions"]

TARGET_SESSIONS = 10_000
TARGET_RSS_BYTES = 1 << 30
_MIB = 1 << 20


async def _open_sessions(
    stack_target: Any, count: int, connections: int, deadline: float
) -> tuple[int, str | None]:
    """Open up to ``count`` sessions over ``connections`` shared connections; stop at ``deadline``.

    A connection whose session fails to open (a cap, a timeout) stops there; the first failure is returned.
    """
    opened = 0
    left = count
    first_error: str | None = None

    async def worker() -> None:
        nonlocal opened, left, first_error
        client = lean_client(30.0)
        try:
            while left > 0 and time.monotonic() < deadline:
                left -= 1
                try:
                    await McpSession(stack_target, "legacy", timeout_s=30.0, client=client).open()
                except (CallError, httpx.HTTPError) as exc:
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
                    return
                opened += 1
        finally:
            await client.aclose()

    async with asyncio.TaskGroup() as group:
        for _ in range(min(connections, count)):
            group.create_task(worker())
    return opened, first_error


async def _warm_up(stack_target: Any, calls: int) -> None:
    session = McpSession(stack_target, "legacy", timeout_s=30.0)
    try:
        await session.open()
        for _ in range(calls):
            await session.call_echo("warm")
    finally:
        await session.close()


def measure_idle_sessions(
    sessions: int,
    *,
    bastion_cmd: str | None = None,
    connections: int = 8,
    time_limit_s: float = 600.0,
    settle_s: float = 1.0,
) -> dict[str, Any]:
    """Open ``sessions`` idle session-era sessions through a fresh ``bastion serve``; RSS before and after."""
    temp = Path(tempfile.mkdtemp(prefix="bastion-idle-"))
    try:
        with running_stack(temp, bastion_cmd=bastion_cmd, execution_ids=False) as stack:
            pid = stack.bastion.pid
            asyncio.run(_warm_up(stack.target, 20))
            time.sleep(settle_s)
            before = rss_bytes(pid)
            started = time.monotonic()
            opened, first_error = asyncio.run(
                _open_sessions(stack.target, sessions, connections, started + time_limit_s)
            )
            took = time.monotonic() - started
            time.sleep(settle_s)
            after = rss_bytes(pid)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    per_session = (after - before) / opened if opened else float("nan")
    measured_at_target = opened >= TARGET_SESSIONS
    at_target = after if measured_at_target else before + per_session * TARGET_SESSIONS
    return {
        "sessions_asked": sessions,
        "sessions_opened": opened,
        "first_error": first_error,
        "open_s": round(took, 2),
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "per_session_bytes": round(per_session, 1),
        "rss_at_10000_bytes": round(at_target),
        "rss_at_10000_extrapolated": not measured_at_target,
        "meets": at_target <= TARGET_RSS_BYTES,
    }


def describe(result: dict[str, Any]) -> str:
    how = "extrapolated" if result["rss_at_10000_extrapolated"] else "measured"
    return (
        f"{result['sessions_opened']:,} idle sessions opened in {result['open_s']:.1f}s: "
        f"RSS {result['rss_before_bytes'] / _MIB:.1f} -> {result['rss_after_bytes'] / _MIB:.1f} MiB, "
        f"{result['per_session_bytes'] / 1024:.1f} KiB/session; "
        f"at 10,000 sessions {result['rss_at_10000_bytes'] / _MIB:.1f} MiB ({how}; target <= 1024 MiB)"
        + (f"; stopped at: {result['first_error']}" if result.get("first_error") else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=TARGET_SESSIONS, help="sessions to open (10000)")
    parser.add_argument("--connections", type=int, default=8, help="kept-alive connections to open them on")
    parser.add_argument("--time-limit", type=float, default=600.0, help="stop opening after this many s")
    parser.add_argument("--bastion-cmd", help="command that runs the bastion CLI (default: the venv's)")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    result = measure_idle_sessions(
        args.sessions,
        bastion_cmd=args.bastion_cmd,
        connections=args.connections,
        time_limit_s=args.time_limit,
    )
    print(describe(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
