"""Bastion's benchmark: the same load, straight to an upstream and through Bastion, in one run.

    .venv/bin/python bench/run.py [--sessions 16] [--calls 2000] [--mode legacy|modern]
                                  [--out bench/results/x.json] [--direct-only]

Starts the bundled example HTTP upstream (``bastion.examples.tools_server``)
on a free port, starts ``bastion serve`` in front of it with a temporary
config and data directory, and drives both with the lean client of
``loadgen.py``: N concurrent sessions calling the echo tool (warm-up, then
measured), and one session at concurrency 1 for latency. It prints a table
with the through/direct ratios against the targets of DESIGN section 10 and
writes every number as JSON. Bastion's CPU per call comes from
``/proc/<pid>/stat`` (utime + stime) around the measured concurrent phase.

Exit status: 0 when every call succeeded, 1 when any call failed, 2 when a
child process could not start. Targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from loadgen import CallError, Mode, PhaseResult, Target, run_phase
from procs import Child, StartFailed, cpu_seconds, free_port

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
UPSTREAM_READY = re.compile(r"^LISTENING (http://\S+/mcp)$")
BASTION_READY = re.compile(r"BASTION READY (http://\S+/mcp)")
NAMESPACE = "tools"
TOOL = "echo"
AGENT = "bench"

# DESIGN section 10, for the 2-core reference machine.
TARGET_THROUGHPUT_RATIO = 0.8
TARGET_ADDED_P50_MS = 1.0
TARGET_ADDED_P99_MS = 5.0
TARGET_CPU_PER_CALL_US = 300.0
TARGET_READY_S = 2.0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=16, help="concurrent client sessions (default 16)")
    parser.add_argument("--calls", type=int, default=2000, help="measured calls in the concurrent phase")
    parser.add_argument("--warmup", type=int, default=400, help="warm-up calls before each measured phase")
    parser.add_argument("--latency-calls", type=int, default=1000, help="measured calls at concurrency 1")
    parser.add_argument("--mode", choices=["legacy", "modern"], default="legacy", help="client protocol era")
    parser.add_argument("--rounds", type=int, default=1, help="alternate direct/through this many times")
    parser.add_argument("--out", type=Path, help="JSON results (default bench/results/<time>-<mode>.json)")
    parser.add_argument("--direct-only", action="store_true", help="measure the upstream alone")
    parser.add_argument("--upstream-json", action="store_true", help="upstream answers JSON, not SSE")
    parser.add_argument("--bastion-cmd", help="command that runs the bastion CLI (default: the venv's)")
    parser.add_argument(
        "--bastion-arg", action="append", default=[], help="extra argument for bastion serve (repeatable)"
    )
    parser.add_argument("--extra-config", type=Path, help="TOML appended to the generated config")
    parser.add_argument("--start-timeout", type=float, default=30.0, help="seconds to wait for readiness")
    parser.add_argument("--call-timeout", type=float, default=30.0, help="seconds per HTTP request")
    parser.add_argument("--phase-timeout", type=float, default=600.0, help="seconds per measured phase")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temp dir (config, logs, data)")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.calls < 1 or args.latency_calls < 1 or args.rounds < 1:
        parser.error("--sessions, --calls, --latency-calls and --rounds must be at least 1")
    return args


def bastion_argv(args: argparse.Namespace) -> list[str]:
    """The bastion CLI: ``--bastion-cmd``, else the script next to this Python, else its entry point."""
    if args.bastion_cmd:
        return shlex.split(args.bastion_cmd)
    script = Path(sys.executable).with_name("bastion")
    if script.exists():
        return [str(script)]
    found = shutil.which("bastion")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from bastion.cli.main import main; sys.exit(main())"]


def write_config(path: Path, upstream_url: str, token: str, extra: Path | None) -> None:
    token_sha256 = hashlib.sha256(token.encode()).hexdigest()
    text = (
        f"[servers.{NAMESPACE}]\n"
        f"url = {json.dumps(upstream_url)}\n\n"
        f"[agents.{AGENT}]\n"
        f'token_sha256 = "{token_sha256}"\n'
    )
    if extra is not None:
        text += "\n" + extra.read_text()
    path.write_text(text)


@dataclass
class Measured:
    """Both phases against one target, and the CPU its processes spent in the concurrent one."""

    concurrent: PhaseResult
    serial: PhaseResult
    cpu_s: dict[str, float]

    def cpu_per_call_us(self, process: str) -> float:
        calls = self.concurrent.calls - self.concurrent.errors
        return self.cpu_s[process] / calls * 1e6 if calls else float("nan")


async def measure(target: Target, args: argparse.Namespace, mode: Mode, watched: dict[str, int]) -> Measured:
    """The concurrent phase (CPU sampled around it), then the concurrency-1 phase."""
    before: dict[str, float] = {}

    def sample_before() -> None:
        before.update({name: cpu_seconds(pid) for name, pid in watched.items()})
        before["client"] = _own_cpu()

    async with asyncio.timeout(args.phase_timeout):
        concurrent = await run_phase(
            target,
            mode,
            sessions=args.sessions,
            warmup_calls=args.warmup,
            calls=args.calls,
            timeout_s=args.call_timeout,
            on_measure_start=sample_before,
        )
    after = {name: cpu_seconds(pid) for name, pid in watched.items()}
    after["client"] = _own_cpu()
    async with asyncio.timeout(args.phase_timeout):
        serial = await run_phase(
            target,
            mode,
            sessions=1,
            warmup_calls=max(1, args.warmup // 4),
            calls=args.latency_calls,
            timeout_s=args.call_timeout,
        )
    return Measured(concurrent, serial, {name: after[name] - before[name] for name in after})


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def fold(rounds: list[Measured]) -> dict[str, Any]:
    """Per-round summaries plus the median of each headline number across rounds."""
    per_round = [
        {
            "concurrent": m.concurrent.summary(),
            "serial": m.serial.summary(),
            "cpu_s": {k: round(v, 4) for k, v in m.cpu_s.items()},
            "cpu_per_call_us": {k: round(m.cpu_per_call_us(k), 1) for k in m.cpu_s},
        }
        for m in rounds
    ]

    def med(path: tuple[str, ...]) -> float:
        values = []
        for summary in per_round:
            node: Any = summary
            for key in path:
                node = node[key]
            values.append(float(node))
        return median(values)

    headline = {
        "calls_per_s": med(("concurrent", "calls_per_s")),
        "concurrent_p50_ms": med(("concurrent", "p50_ms")),
        "concurrent_p99_ms": med(("concurrent", "p99_ms")),
        "serial_p50_ms": med(("serial", "p50_ms")),
        "serial_p99_ms": med(("serial", "p99_ms")),
        "errors": sum(s["concurrent"]["errors"] + s["serial"]["errors"] for s in per_round),
    }
    for name in per_round[0]["cpu_per_call_us"]:
        headline[f"{name}_cpu_per_call_us"] = med(("cpu_per_call_us", name))
    return {"headline": headline, "rounds": per_round}


def ratios(direct: dict[str, Any], through: dict[str, Any]) -> dict[str, float]:
    d, t = direct["headline"], through["headline"]
    return {
        "throughput_ratio": round(t["calls_per_s"] / d["calls_per_s"], 3),
        "concurrent_p50_ratio": round(t["concurrent_p50_ms"] / d["concurrent_p50_ms"], 3),
        "concurrent_p99_ratio": round(t["concurrent_p99_ms"] / d["concurrent_p99_ms"], 3),
        "added_p50_ms": round(t["serial_p50_ms"] - d["serial_p50_ms"], 3),
        "added_p99_ms": round(t["serial_p99_ms"] - d["serial_p99_ms"], 3),
    }


def render_table(results: dict[str, Any], args: argparse.Namespace) -> str:
    direct = results["direct"]["headline"]
    through = results.get("through", {}).get("headline")
    compared = results.get("compared")
    n = args.sessions
    rows: list[tuple[str, str, str, str]] = []

    def row(label: str, key: str, fmt: str, ratio: str = "") -> None:
        d = format(direct[key], fmt)
        t = format(through[key], fmt) if through else "-"
        rows.append((label, d, t, ratio))

    row(
        f"calls/s  ({n} sessions)",
        "calls_per_s",
        ".1f",
        f"{compared['throughput_ratio']:.3f}x" if compared else "",
    )
    row(f"p50 ms   ({n} sessions)", "concurrent_p50_ms", ".3f")
    row(f"p99 ms   ({n} sessions)", "concurrent_p99_ms", ".3f")
    row(
        "p50 ms   (concurrency 1)",
        "serial_p50_ms",
        ".3f",
        f"+{compared['added_p50_ms']:.3f} ms" if compared else "",
    )
    row(
        "p99 ms   (concurrency 1)",
        "serial_p99_ms",
        ".3f",
        f"+{compared['added_p99_ms']:.3f} ms" if compared else "",
    )
    row("upstream CPU/call us", "upstream_cpu_per_call_us", ".1f")
    row("client CPU/call us", "client_cpu_per_call_us", ".1f")
    if through:
        rows.append(("bastion CPU/call us", "-", format(through["bastion_cpu_per_call_us"], ".1f"), ""))
    rows.append(("errors", str(direct["errors"]), str(through["errors"]) if through else "-", ""))
    header = ("", "direct", "through", "through/direct")
    widths = [max(len(r[i]) for r in [*rows, header]) for i in range(4)]
    lines = [
        f"{header[0]:<{widths[0]}}  {header[1]:>{widths[1]}}  {header[2]:>{widths[2]}}  {header[3]}",
        *(f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}  {d}" for a, b, c, d in rows),
    ]
    if compared:
        lines.append("")
        lines.extend(f"  {verdict}" for verdict in results["targets"])
    return "\n".join(lines)


def verdicts(compared: dict[str, float], through: dict[str, Any], ready_s: float) -> list[str]:
    def check(ok: bool, text: str) -> str:
        return f"[{'meets' if ok else 'MISSES'}] {text}"

    cpu = through["headline"]["bastion_cpu_per_call_us"]
    return [
        check(
            compared["throughput_ratio"] >= TARGET_THROUGHPUT_RATIO,
            f"throughput {compared['throughput_ratio']:.3f}x direct (target >= {TARGET_THROUGHPUT_RATIO}x)",
        ),
        check(
            compared["added_p50_ms"] <= TARGET_ADDED_P50_MS,
            f"added p50 {compared['added_p50_ms']:.3f} ms (target <= {TARGET_ADDED_P50_MS} ms)",
        ),
        check(
            compared["added_p99_ms"] <= TARGET_ADDED_P99_MS,
            f"added p99 {compared['added_p99_ms']:.3f} ms (target <= {TARGET_ADDED_P99_MS} ms)",
        ),
        check(
            cpu <= TARGET_CPU_PER_CALL_US,
            f"bastion CPU {cpu:.1f} us/call (target <= {TARGET_CPU_PER_CALL_US} us)",
        ),
        check(
            ready_s <= TARGET_READY_S,
            f"bastion start to ready {ready_s:.2f} s (target <= {TARGET_READY_S} s)",
        ),
    ]


def environment() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "git_commit": commit or None,
    }


async def bench(args: argparse.Namespace, temp: Path) -> tuple[dict[str, Any], int]:
    mode: Mode = args.mode
    children: list[Child] = []
    try:
        upstream_env = dict(os.environ, BASTION_COUNTER_FILE=str(temp / "counter"))
        upstream_argv = [
            sys.executable,
            "-m",
            "bastion.examples.tools_server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ]
        if args.upstream_json:
            upstream_argv.append("--json-response")
        upstream = Child.start(
            "upstream",
            upstream_argv,
            ready=UPSTREAM_READY,
            log_path=temp / "upstream.log",
            env=upstream_env,
            timeout_s=args.start_timeout,
        )
        children.append(upstream)
        upstream_url = UPSTREAM_READY.match(upstream.ready_line).group(1)  # type: ignore[union-attr]
        direct_target = Target("direct", upstream_url, TOOL)

        through_target: Target | None = None
        bastion: Child | None = None
        if not args.direct_only:
            token = secrets.token_urlsafe(32)
            config = temp / "bastion.toml"
            write_config(config, upstream_url, token, args.extra_config)
            data_dir = temp / "data"
            data_dir.mkdir()
            bastion = Child.start(
                "bastion",
                [
                    *bastion_argv(args),
                    "serve",
                    "--config",
                    str(config),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--data-dir",
                    str(data_dir),
                    *args.bastion_arg,
                ],
                ready=BASTION_READY,
                log_path=temp / "bastion.log",
                timeout_s=args.start_timeout,
            )
            children.append(bastion)
            bastion_url = BASTION_READY.search(bastion.ready_line).group(1)  # type: ignore[union-attr]
            through_target = Target(
                "through",
                bastion_url,
                f"{NAMESPACE}__{TOOL}",
                headers={"authorization": f"Bearer {token}"},
            )

        watched = {"upstream": upstream.pid}
        if bastion is not None:
            watched["bastion"] = bastion.pid
        direct_rounds: list[Measured] = []
        through_rounds: list[Measured] = []
        for round_index in range(args.rounds):
            print(f"round {round_index + 1}/{args.rounds}: direct ...", file=sys.stderr, flush=True)
            direct_rounds.append(await measure(direct_target, args, mode, {"upstream": upstream.pid}))
            if through_target is not None:
                print(
                    f"round {round_index + 1}/{args.rounds}: through bastion ...", file=sys.stderr, flush=True
                )
                through_rounds.append(await measure(through_target, args, mode, watched))

        results: dict[str, Any] = {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "settings": {
                "mode": mode,
                "sessions": args.sessions,
                "calls": args.calls,
                "warmup": args.warmup,
                "latency_calls": args.latency_calls,
                "rounds": args.rounds,
                "upstream_response": "json" if args.upstream_json else "sse",
                "direct_only": args.direct_only,
            },
            "environment": environment(),
            "upstream_ready_s": round(upstream.ready_after_s, 3),
            "direct": fold(direct_rounds),
        }
        if bastion is not None:
            results["bastion_ready_s"] = round(bastion.ready_after_s, 3)
            results["through"] = fold(through_rounds)
            results["compared"] = ratios(results["direct"], results["through"])
            results["targets"] = verdicts(results["compared"], results["through"], bastion.ready_after_s)
        errors = results["direct"]["headline"]["errors"] + results.get("through", {}).get("headline", {}).get(
            "errors", 0
        )
        return results, (1 if errors else 0)
    finally:
        for child in reversed(children):
            child.stop()


def print_log_tails(temp: Path, lines: int = 30) -> None:
    for log in sorted(temp.glob("*.log")):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        print(f"--- {log.name} (last {lines} lines) ---\n{tail}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    temp = Path(tempfile.mkdtemp(prefix="bastion-bench-"))
    try:
        try:
            results, status = asyncio.run(bench(args, temp))
        except StartFailed as failure:
            print(f"bench: {failure}", file=sys.stderr)
            print_log_tails(temp)
            return 2
        except (CallError, httpx.HTTPError, TimeoutError) as failure:
            print(f"bench: a session could not open or warm up: {failure!r}", file=sys.stderr)
            print_log_tails(temp)
            return 1
        out = args.out or BENCH_DIR / "results" / f"{time.strftime('%Y%m%dT%H%M%S')}-{args.mode}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(render_table(results, args))
        print(f"\nwrote {out}")
        if status:
            print("bench: some calls failed; see first_error in the JSON", file=sys.stderr)
        return status
    finally:
        if args.keep_temp:
            print(f"temp dir kept: {temp}", file=sys.stderr)
        else:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
