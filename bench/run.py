"""Bastion's benchmark: the same load, straight to an upstream and through Bastion, in one run.

    .venv/bin/python bench/run.py [--sessions 16] [--calls 2000] [--mode legacy|modern]
                                  [--out bench/results/x.json] [--direct-only]
                                  [--audit-off-too] [--execution-ids]

Starts the bundled example HTTP upstream (``bastion.examples.tools_server``)
on a free port, starts ``bastion serve`` in front of it with a temporary
config and data directory, and drives both with the lean client of
``loadgen.py``: N concurrent sessions calling the echo tool (warm-up, then
measured), and one session at concurrency 1 for latency. It prints a table
with the through/direct ratios against the targets of DESIGN section 10 and
writes every number as JSON. Bastion's CPU per call comes from
``/proc/<pid>/stat`` (utime + stime) around the measured concurrent phase.

``--nginx`` also measures Debian's nginx as a pure reverse proxy in front of
the same upstream (``relay.py``; installed when missing), in the same rounds:
the physical limit of one extra hop, and every Bastion ratio against it
(``bastion_vs_nginx``).

``--history N`` also measures a Bastion whose store already holds a long
history (``history.py``: N audit entries in closed chains and
``--history-executions`` finished executions, written before it starts), in
the same rounds as the one on a fresh store, and with ``--postgres`` the same
on PostgreSQL: "cost flat as history grows" (``history_vs_fresh``).

``--audit-off-too`` starts a second Bastion (own port, own data directory)
with ``--unsafe-no-audit`` and measures it in the same rounds, for the
durable audit / audit off ratio. ``--execution-ids`` makes every call to
either Bastion carry a fresh ``params._cmcp.execution_id`` (never the direct
calls: the upstream does not know the envelope).

Exit status: 0 when every call succeeded, 1 when any call failed, 2 when a
child process could not start, 128 + the signal's number when SIGTERM or
SIGINT stopped it (after the same cleanup as a normal exit: children and a
throwaway cluster stopped, the temp dir removed). Targets are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
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

import engines
from history import fill_history
from loadgen import CallError, Mode, PhaseResult, Target, run_phase
from procs import Child, StartFailed, Terminated, cpu_seconds, free_port, raise_on_signals
from relay import RelayUnavailable, start_nginx_relay
from traced import render_tracing, sink_counts, start_sink, traced_env, tracing_ratios, untraced_env

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
TARGET_AUDIT_RATIO = 0.8  # durable audit >= 0.8 x the same run with auditing off


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
    parser.add_argument(
        "--audit-off-too",
        action="store_true",
        help="also measure a second bastion started with --unsafe-no-audit (durable audit / audit off)",
    )
    parser.add_argument(
        "--tracing-too",
        action="store_true",
        help="also measure a bastion tracing every call to a loopback OTLP receiver (tracing on / off)",
    )
    parser.add_argument(
        "--nginx",
        action="store_true",
        help="also measure Debian's nginx as a pure reverse proxy to the same upstream (the hop's limit)",
    )
    parser.add_argument(
        "--history",
        type=int,
        metavar="ENTRIES",
        help="also measure a bastion whose store holds this many audit entries first (bench/history.py)",
    )
    parser.add_argument(
        "--history-executions",
        type=int,
        help="with --history: finished executions in that store (default ENTRIES / 10)",
    )
    parser.add_argument(
        "--execution-ids",
        action="store_true",
        help="every call through bastion carries a fresh params._cmcp.execution_id",
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="also measure a bastion on PostgreSQL (a throwaway durable cluster unless --store is given)"
        " and count store operations per governed call on each engine",
    )
    parser.add_argument(
        "--store", help="with --postgres: this postgresql:// database instead of a throwaway one"
    )
    parser.add_argument(
        "--store-ops-calls",
        type=int,
        default=500,
        help="with --postgres: calls per engine in the store-operations count (0 skips the count)",
    )
    parser.add_argument("--start-timeout", type=float, default=30.0, help="seconds to wait for readiness")
    parser.add_argument("--call-timeout", type=float, default=30.0, help="seconds per HTTP request")
    parser.add_argument("--phase-timeout", type=float, default=600.0, help="seconds per measured phase")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temp dir (config, logs, data)")
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.calls < 1 or args.latency_calls < 1 or args.rounds < 1:
        parser.error("--sessions, --calls, --latency-calls and --rounds must be at least 1")
    if args.direct_only and (args.audit_off_too or args.tracing_too or args.execution_ids or args.postgres):
        parser.error(
            "--audit-off-too, --tracing-too, --execution-ids and --postgres need bastion; drop --direct-only"
        )
    if args.store and not args.postgres:
        parser.error("--store is for --postgres")
    if args.history is not None and (args.direct_only or args.store or args.history < 4):
        parser.error("--history needs bastion, a throwaway cluster (no --store) and at least 4 entries")
    if args.history is not None and args.history_executions is None:
        args.history_executions = args.history // 10
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


def serial_warmup(args: argparse.Namespace) -> int:
    """Warm-up calls before the concurrency-1 phase."""
    return max(1, args.warmup // 4)


def calls_per_round(args: argparse.Namespace) -> int:
    """Every call :func:`measure` sends one target in one round, warm-ups included."""
    return args.warmup + args.calls + serial_warmup(args) + args.latency_calls


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
            warmup_calls=serial_warmup(args),
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


def relay_ratios(relay: dict[str, Any], through: dict[str, Any]) -> dict[str, float]:
    """Bastion against the nginx relay of the same run: throughput, latency and CPU per call."""
    r, t = relay["headline"], through["headline"]
    return {
        "throughput_ratio": round(t["calls_per_s"] / r["calls_per_s"], 3),
        "added_p50_ms": round(t["serial_p50_ms"] - r["serial_p50_ms"], 3),
        "added_p99_ms": round(t["serial_p99_ms"] - r["serial_p99_ms"], 3),
        "relay_cpu_per_call_us": r["relay_cpu_per_call_us"],
        "cpu_ratio": round(t["bastion_cpu_per_call_us"] / r["relay_cpu_per_call_us"], 3)
        if r["relay_cpu_per_call_us"] > 0
        else float("nan"),
    }


def history_ratios(fresh: dict[str, Any], long: dict[str, Any]) -> dict[str, float]:
    """A store holding a long history against a fresh one, same engine, same rounds."""
    f, h = fresh["headline"], long["headline"]
    return {
        "throughput_ratio": round(h["calls_per_s"] / f["calls_per_s"], 3),
        "cpu_ratio": round(h["bastion_cpu_per_call_us"] / f["bastion_cpu_per_call_us"], 3),
        "added_p50_ms": round(h["serial_p50_ms"] - f["serial_p50_ms"], 3),
    }


async def _history_bastions(
    args: argparse.Namespace, temp: Path, config: Path, token: str, children: list[Child]
) -> list[tuple[str, Child, Target]]:
    """A bastion on a store filled with ``--history`` first (and one on PostgreSQL with ``--postgres``)."""
    started: list[tuple[str, Child, Target]] = []
    stores: list[tuple[str, str | None]] = [("through_history", None)]
    if args.postgres:
        stores.append(("through_postgres_history", engines.postgres_url(args, temp, "bench_history")))
    args.history_filled = {}
    for key, url in stores:
        data = temp / f"data-{key}"
        data.mkdir()
        print(f"bench: writing the history of {key} ...", file=sys.stderr, flush=True)
        args.history_filled[key] = await fill_history(
            url, data, entries=args.history, executions=args.history_executions
        )
        extra = () if url is None else ("--store", url, "--generation", "bench-postgres-history")
        child, target = start_bastion(
            args, temp, config, token, key, f"bastion-{key.removeprefix('through_')}", data.name, *extra
        )
        _started(children, child)
        started.append((key, child, target))
    return started


def render_history(results: dict[str, Any]) -> str:
    """Each long-history bastion against the fresh one of its engine."""
    lines = []
    for engine, key in (("sqlite", "compared_history"), ("postgresql", "compared_postgres_history")):
        if key in results:
            r = results[key]
            lines.append(
                f"{engine}, long history vs a fresh store: throughput {r['throughput_ratio']:.3f}x, "
                f"CPU per call {r['cpu_ratio']:.3f}x, p50 {r['added_p50_ms']:+.3f} ms (target: within 10%)"
            )
    return "\n".join(lines)


def render_relay(results: dict[str, Any]) -> str:
    """The nginx relay's figures, and Bastion's against them."""
    relay, compared = results["through_nginx"]["headline"], results["compared_nginx"]
    lines = [
        f"nginx relay: {relay['calls_per_s']:.1f} calls/s ({compared['throughput_ratio']:.3f}x direct), "
        f"p50 +{compared['added_p50_ms']:.3f} ms at concurrency 1, "
        f"{relay['relay_cpu_per_call_us']:.1f} us CPU per call"
    ]
    versus = results.get("bastion_vs_nginx")
    if versus:
        lines.append(
            f"bastion / nginx: throughput {versus['throughput_ratio']:.3f}x (target >= 0.95x), "
            f"CPU per call {versus['cpu_ratio']:.2f}x (target <= 2x), p50 {versus['added_p50_ms']:+.3f} ms"
        )
    return "\n".join(lines)


def audit_ratios(audit_on: dict[str, Any], audit_off: dict[str, Any]) -> dict[str, float]:
    """Durable audit against the same run with auditing off: what the audit chain costs."""
    on, off = audit_on["headline"], audit_off["headline"]
    return {
        "throughput_ratio": round(on["calls_per_s"] / off["calls_per_s"], 3),
        "concurrent_p50_ratio": round(on["concurrent_p50_ms"] / off["concurrent_p50_ms"], 3),
        "concurrent_p99_ratio": round(on["concurrent_p99_ms"] / off["concurrent_p99_ms"], 3),
        "added_p50_ms": round(on["serial_p50_ms"] - off["serial_p50_ms"], 3),
        "added_p99_ms": round(on["serial_p99_ms"] - off["serial_p99_ms"], 3),
        "added_bastion_cpu_per_call_us": round(
            on["bastion_cpu_per_call_us"] - off["bastion_cpu_per_call_us"], 1
        ),
    }


def render_table(results: dict[str, Any], args: argparse.Namespace) -> str:
    direct = results["direct"]["headline"]
    through = results.get("through", {}).get("headline")
    audit_off = results.get("through_audit_off", {}).get("headline")
    compared = results.get("compared")
    audit = results.get("compared_audit")
    n = args.sessions
    rows: list[list[str]] = []

    def row(label: str, key: str, fmt: str, ratio: str = "", audit_ratio: str = "") -> None:
        cells = [label, format(direct[key], fmt), format(through[key], fmt) if through else "-"]
        if audit_off:
            cells.append(format(audit_off[key], fmt))
        cells.append(ratio)
        if audit_off:
            cells.append(audit_ratio)
        rows.append(cells)

    row(
        f"calls/s  ({n} sessions)",
        "calls_per_s",
        ".1f",
        f"{compared['throughput_ratio']:.3f}x" if compared else "",
        f"{audit['throughput_ratio']:.3f}x" if audit else "",
    )
    row(f"p50 ms   ({n} sessions)", "concurrent_p50_ms", ".3f")
    row(f"p99 ms   ({n} sessions)", "concurrent_p99_ms", ".3f")
    row(
        "p50 ms   (concurrency 1)",
        "serial_p50_ms",
        ".3f",
        f"+{compared['added_p50_ms']:.3f} ms" if compared else "",
        f"{audit['added_p50_ms']:+.3f} ms" if audit else "",
    )
    row(
        "p99 ms   (concurrency 1)",
        "serial_p99_ms",
        ".3f",
        f"+{compared['added_p99_ms']:.3f} ms" if compared else "",
        f"{audit['added_p99_ms']:+.3f} ms" if audit else "",
    )
    row("upstream CPU/call us", "upstream_cpu_per_call_us", ".1f")
    row("client CPU/call us", "client_cpu_per_call_us", ".1f")
    if through:
        cells = ["bastion CPU/call us", "-", format(through["bastion_cpu_per_call_us"], ".1f")]
        if audit_off:
            cells += [format(audit_off["bastion_cpu_per_call_us"], ".1f"), ""]
            cells.append(f"{audit['added_bastion_cpu_per_call_us']:+.1f} us" if audit else "")
        else:
            cells.append("")
        rows.append(cells)
    cells = ["errors", str(direct["errors"]), str(through["errors"]) if through else "-"]
    if audit_off:
        cells += [str(audit_off["errors"]), "", ""]
    else:
        cells.append("")
    rows.append(cells)
    header = ["", "direct", "through"]
    if audit_off:
        header += ["through, audit off", "through/direct", "durable audit/audit off"]
    else:
        header.append("through/direct")
    widths = [max(len(r[i]) for r in [*rows, header]) for i in range(len(header))]

    numbers = 3 if audit_off else 2  # value columns after the label; ratio columns follow

    def line(cells: list[str]) -> str:
        # Label and ratios left-aligned, values right-aligned.
        parts = [
            f"{cell:>{widths[i]}}" if 1 <= i <= numbers else f"{cell:<{widths[i]}}"
            for i, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    lines = [line(header), *(line(r) for r in rows)]
    if compared:
        lines.append("")
        lines.extend(f"  {verdict}" for verdict in results["targets"])
    return "\n".join(lines)


def _check(ok: bool, text: str) -> str:
    return f"[{'meets' if ok else 'MISSES'}] {text}"


def verdicts(
    compared: dict[str, float],
    through: dict[str, Any],
    ready_s: float,
    audit: dict[str, float] | None = None,
) -> list[str]:
    check = _check
    cpu = through["headline"]["bastion_cpu_per_call_us"]
    audit_lines = []
    if audit is not None:
        audit_lines.append(
            check(
                audit["throughput_ratio"] >= TARGET_AUDIT_RATIO,
                f"durable audit {audit['throughput_ratio']:.3f}x audit off (target >= {TARGET_AUDIT_RATIO}x)",
            )
        )
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
        *audit_lines,
    ]


def start_bastion(
    args: argparse.Namespace,
    temp: Path,
    config: Path,
    token: str,
    label: str,
    name: str,
    data: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> tuple[Child, Target]:
    """``bastion serve`` on a free port with its own data dir under ``temp``, and its target.

    ``env``: its environment (default this one without ``OTEL_*``: tracing off, see ``traced.py``).
    """
    data_dir = temp / data
    data_dir.mkdir(exist_ok=True)  # bench/history.py may have filled it
    child = Child.start(
        name,
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
            *extra,
            *args.bastion_arg,
        ],
        ready=BASTION_READY,
        log_path=temp / f"{name}.log",
        env=untraced_env() if env is None else env,
        timeout_s=args.start_timeout,
    )
    url = BASTION_READY.search(child.ready_line).group(1)  # type: ignore[union-attr]
    target = Target(
        label,
        url,
        f"{NAMESPACE}__{TOOL}",
        headers={"authorization": f"Bearer {token}"},
        execution_ids=args.execution_ids,
    )
    return child, target


def start_upstream(temp: Path, timeout_s: float, *, json_response: bool = False) -> tuple[Child, str]:
    """The bundled example HTTP upstream on a free port, and its MCP endpoint URL."""
    argv = [sys.executable, "-m", "bastion.examples.tools_server", "--host", "127.0.0.1", "--port", "0"]
    if json_response:
        argv.append("--json-response")
    upstream = Child.start(
        "upstream",
        argv,
        ready=UPSTREAM_READY,
        log_path=temp / "upstream.log",
        env=dict(os.environ, BASTION_COUNTER_FILE=str(temp / "counter")),
        timeout_s=timeout_s,
    )
    return upstream, UPSTREAM_READY.match(upstream.ready_line).group(1)  # type: ignore[union-attr]


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


def _started(children: list[Child], bastion: Child) -> None:
    """Held for cleanup first, then announced: a signal after the line still finds it in ``children``."""
    children.append(bastion)
    print(f"bench: {bastion.name} ready", file=sys.stderr, flush=True)


@dataclass
class Slot:
    """One target measured in every round: its results key, its progress label, what it watches."""

    key: str
    what: str
    target: Target
    watched: dict[str, int]


async def bench(args: argparse.Namespace, temp: Path) -> tuple[dict[str, Any], int]:
    mode: Mode = args.mode
    children: list[Child] = []
    try:
        upstream, upstream_url = start_upstream(temp, args.start_timeout, json_response=args.upstream_json)
        children.append(upstream)
        plan = [Slot("direct", "direct", Target("direct", upstream_url, TOOL), {"upstream": upstream.pid})]
        if args.nginx:
            relay, relay_url = start_nginx_relay(temp, upstream_url, args.start_timeout)
            children.append(relay)
            plan.append(
                Slot("through_nginx", "through nginx", Target("nginx", relay_url, TOOL),
                     {"upstream": upstream.pid, "relay": relay.pid})
            )  # fmt: skip
        bastions: dict[str, Child] = {}  # results key -> the bastion measured under it
        sink_url = ""
        if not args.direct_only:
            token = secrets.token_urlsafe(32)
            config = temp / "bastion.toml"
            write_config(config, upstream_url, token, args.extra_config)
            started: list[tuple[str, Child, Target]] = []

            def serve(key: str, name: str, data: str, *extra: str, env: dict[str, str] | None = None) -> None:
                # Own port, own data dir; the same config, token and --bastion-arg.
                child, target = start_bastion(args, temp, config, token, key, name, data, *extra, env=env)
                _started(children, child)
                started.append((key, child, target))

            serve("through", "bastion", "data")
            if args.audit_off_too:
                serve("through_audit_off", "bastion-audit-off", "data-audit-off", "--unsafe-no-audit")
            if args.tracing_too:
                sink, sink_url = start_sink(temp, args.start_timeout)
                children.append(sink)
                serve("through_tracing", "bastion-tracing", "data-tracing", env=traced_env(sink_url))
            if args.postgres:
                # The state lives in PostgreSQL; the data dir holds the keys only.
                store_url = engines.postgres_url(args, temp)
                serve(
                    "through_postgres", "bastion-postgres", "data-postgres",
                    "--store", store_url, "--generation", "bench-postgres",
                )  # fmt: skip
            if args.history is not None:
                started += await _history_bastions(args, temp, config, token, children)
            for key, child, target in started:
                bastions[key] = child
                # Each phase watches the upstream and the one Bastion it goes through (as "bastion").
                what = "through bastion" + key.removeprefix("through").replace("_", " ").replace(" ", ", ", 1)
                plan.append(Slot(key, what, target, {"upstream": upstream.pid, "bastion": child.pid}))

        measured: dict[str, list[Measured]] = {slot.key: [] for slot in plan}
        for round_index in range(args.rounds):
            for slot in plan:
                print(f"round {round_index + 1}/{args.rounds}: {slot.what} ...", file=sys.stderr, flush=True)
                measured[slot.key].append(await measure(slot.target, args, mode, slot.watched))

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
                "audit_off_too": args.audit_off_too,
                "tracing_too": args.tracing_too,
                "execution_ids": args.execution_ids,
                "nginx": args.nginx,
            },
            "environment": environment(),
            "upstream_ready_s": round(upstream.ready_after_s, 3),
            **{key: fold(rounds) for key, rounds in measured.items()},
        }
        for key, child in bastions.items():
            results[f"bastion{key.removeprefix('through')}_ready_s"] = round(child.ready_after_s, 3)
        if "through_nginx" in results:
            results["compared_nginx"] = ratios(results["direct"], results["through_nginx"])
        if "through" in results:
            results["compared"] = ratios(results["direct"], results["through"])
            if "through_nginx" in results:
                results["bastion_vs_nginx"] = relay_ratios(results["through_nginx"], results["through"])
            audit: dict[str, float] | None = None
            if "through_audit_off" in results:
                results["compared_audit_off"] = ratios(results["direct"], results["through_audit_off"])
                audit = audit_ratios(results["through"], results["through_audit_off"])
                results["compared_audit"] = audit
            if "through_tracing" in results:
                bastions["through_tracing"].stop()  # its last batch of spans is flushed on the way out
                results["compared_tracing"] = tracing_ratios(
                    results["through"],
                    results["through_tracing"],
                    sink_counts(sink_url),
                    args.rounds * calls_per_round(args),
                )
            if "through_postgres" in results:
                results["compared_postgres"] = ratios(results["direct"], results["through_postgres"])
                results["postgres_vs_sqlite"] = engines.engine_ratios(
                    results["through"], results["through_postgres"]
                )
                if args.store_ops_calls > 0:
                    print("counting store operations per governed call ...", file=sys.stderr, flush=True)
                    results["store_ops_per_call"] = await engines.store_ops_both(
                        args, temp, upstream_url, mode, engines.postgres_url(args, temp)
                    )
            if args.history is not None:
                results["history"] = args.history_filled
                for key in args.history_filled:
                    fresh = results["through_postgres" if "postgres" in key else "through"]
                    results[key.replace("through", "compared")] = history_ratios(fresh, results[key])
            results["targets"] = verdicts(
                results["compared"], results["through"], bastions["through"].ready_after_s, audit
            )
        errors = sum(results[key]["headline"]["errors"] for key in measured)
        return results, (1 if errors else 0)
    finally:
        for child in reversed(children):
            child.stop()
        engines.stop_postgres()


def print_log_tails(temp: Path, lines: int = 30) -> None:
    for log in sorted(temp.glob("*.log")):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        print(f"--- {log.name} (last {lines} lines) ---\n{tail}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_signals()  # SIGTERM / SIGINT unwind through the same cleanup as a normal exit
    temp = Path(tempfile.mkdtemp(prefix="bastion-bench-"))
    try:
        try:
            results, status = asyncio.run(bench(args, temp))
        except Terminated as stop:
            # The tasks it interrupted hold it too; asyncio would log each as "never retrieved".
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            print(f"bench: stopped by {stop}; what it started is stopped", file=sys.stderr)
            return 128 + stop.signum
        except RelayUnavailable as missing:
            print(f"bench: no nginx relay: {missing}", file=sys.stderr)
            return 2
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
        if "through_nginx" in results:
            print("\n" + render_relay(results))
        if "history" in results:
            print("\n" + render_history(results))
        if "compared_tracing" in results:
            print("\n" + render_tracing(results))
        if "through_postgres" in results:
            print("\n" + engines.render_engines(results))
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
