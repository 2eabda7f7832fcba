"""``make bench``: every target of DESIGN section 10 (issue #13) in one table, for one build or two.

    .venv/bin/python bench/table.py [--quick] [--bastion-cmd CMD] [--compare BEFORE_CMD] [--out-dir DIR]

Runs, for each build (``--bastion-cmd``, default the venv's ``bastion``; with
``--compare``, that other build first at every step, then this one):

1. ``run.py`` four times: the session era (``--mode legacy``) and the
   sessionless era (``--mode modern``), each with execution ids on and off,
   each with Debian's nginx as a pure relay beside direct (``--nginx``,
   installed when missing; ``--no-nginx`` skips it); the sessionless run
   with execution ids also measures bastions on stores that hold a long
   history first (``--history``: 1,000,000 entries, 100,000 executions;
   SQLite, and PostgreSQL unless ``--no-postgres``);
   the two runs with execution ids on also measure a Bastion with its audit
   off (``--audit-off-too``), one tracing every call to a loopback OTLP
   receiver (``--tracing-too``) and one on PostgreSQL (``--postgres``, one
   replica, a throwaway durable cluster), unless ``--no-postgres`` or the
   PostgreSQL server programs are missing;
2. ``idle_sessions.py``: 10,000 idle session-era sessions, RSS before and after;
3. ``verify_throughput.py``: ``bastion verify`` on one CPU, rate and peak RSS
   against bundle size;
4. ``soak.py``: RSS over a soak at full load (10 minutes; ``--soak-s``).

Then it prints one row per target (``targets.py``): the figure measured, the
ratio to direct or the context, and ``meets``/``MISSES`` (``n/a`` with the
reason when a figure could not be measured). Every result goes to JSON under
``--out-dir`` (default ``bench/results/<time>-table/``): one file per
benchmark and build, and ``table.json`` with the rows. ``--quick`` shrinks
every count so the whole table takes a few minutes: a smoke run, not a
measurement. Exit status 1 when a benchmark failed or a call failed, else 0;
a missed target does not change it (targets are reported, never asserted).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import repo_path  # noqa: F401  (puts the repository root on sys.path: tests.support)
import targets
from idle_sessions import describe as describe_idle
from idle_sessions import measure_idle_sessions
from procs import Terminated, raise_on_signals, run_to_end
from relay import RelayUnavailable, find_nginx
from soak import describe as describe_soak
from soak import run_soak
from tests.support.pg_cluster import PostgresUnavailable, find_bindir
from verify_throughput import describe as describe_verify
from verify_throughput import measure_verify

BENCH_DIR = Path(__file__).resolve().parent

FULL = {
    "sessions": 16,
    "calls": 2000,
    "warmup": 400,
    "latency_calls": 1000,
    "rounds": 1,
    "idle_sessions": 10_000,
    "soak_s": 600.0,
    "soak_sample_s": 10.0,
    "verify_entries": [100_000, 1_000_000],
    "history_entries": 1_000_000,
}
QUICK = {
    **FULL,
    "calls": 400,
    "warmup": 100,
    "latency_calls": 200,
    "idle_sessions": 1000,
    "soak_s": 30.0,
    "soak_sample_s": 3.0,
    "verify_entries": [20_000, 200_000],
    "history_entries": 100_000,
}


@dataclass(frozen=True)
class Build:
    """One build to measure: a name for the table and the command that runs its CLI (None: the venv's)."""

    name: str
    cmd: str | None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/table.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run of a few minutes")
    parser.add_argument(
        "--bastion-cmd", help="command that runs the bastion CLI to measure (default: the venv's)"
    )
    parser.add_argument("--compare", metavar="CMD", help="also measure this build, shown as 'before'")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL figures")
    parser.add_argument("--no-nginx", action="store_true", help="skip the nginx relay (bench/relay.py)")
    parser.add_argument(
        "--out-dir", type=Path, help="where the JSON goes (default bench/results/<time>-table)"
    )
    parser.add_argument("--sessions", type=int, help="run.py: concurrent sessions (16)")
    parser.add_argument("--calls", type=int, help="run.py: measured calls per phase (2000; quick 400)")
    parser.add_argument("--warmup", type=int, help="run.py: warm-up calls (400; quick 100)")
    parser.add_argument("--latency-calls", type=int, help="run.py: calls at concurrency 1 (1000; quick 200)")
    parser.add_argument("--rounds", type=int, help="run.py: rounds, median reported (1)")
    parser.add_argument("--idle-sessions", type=int, help="idle sessions to open (10000; quick 1000)")
    parser.add_argument("--soak-s", type=float, help="soak duration in seconds (600; quick 30)")
    parser.add_argument("--soak-sample-s", type=float, help="seconds between soak RSS samples (10; quick 3)")
    parser.add_argument(
        "--verify-entries",
        type=int,
        nargs="+",
        help="verify bundle sizes (100000 1000000; quick 20000 200000)",
    )
    parser.add_argument(
        "--history-entries",
        type=int,
        help="audit entries in the long-history stores, a tenth as many executions (1000000; quick 100000)",
    )
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per run.py run (1800)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _postgres_available() -> bool:
    try:
        find_bindir()
    except PostgresUnavailable:
        return False
    return True


def run_bench(
    build: Build, name: str, args: argparse.Namespace, out: Path, postgres: bool, nginx: bool
) -> dict[str, Any]:
    """One ``run.py`` run in its own process; its JSON, or ``{"error": ...}``."""
    mode, execution_ids, extras = targets.RUNS[name]
    argv = [
        sys.executable, str(BENCH_DIR / "run.py"), "--mode", mode,
        "--sessions", str(args.sessions), "--calls", str(args.calls), "--warmup", str(args.warmup),
        "--latency-calls", str(args.latency_calls), "--rounds", str(args.rounds),
        "--store-ops-calls", "0", "--out", str(out),
    ]  # fmt: skip
    if build.cmd:
        argv += ["--bastion-cmd", build.cmd]
    if execution_ids:
        argv.append("--execution-ids")
    if nginx:
        argv.append("--nginx")
    if name == targets.HISTORY_RUN:
        argv += ["--history", str(args.history_entries)]
    if extras:
        argv += ["--audit-off-too", "--tracing-too"]
        if postgres:
            argv.append("--postgres")
    # run.py's table and progress go to stderr here: stdout is for the one table.
    status = run_to_end(argv, timeout_s=args.run_timeout, stdout=sys.stderr)
    if status is None:
        return {"error": f"timed out after {args.run_timeout:.0f} s"}
    if not out.exists():
        return {"error": f"run.py exited {status} without results"}
    results: dict[str, Any] = json.loads(out.read_text())
    if status != 0:
        results["exit_status"] = status
    return results


def _step(
    what: str, measure: Callable[[], dict[str, Any]], describe: Callable[[dict[str, Any]], str], out: Path
) -> dict[str, Any]:
    try:
        result = measure()
    except Exception as exc:  # a failed benchmark is a row with "n/a", not a lost table
        result = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{what}: {result['error']}", file=sys.stderr, flush=True)
    else:
        print(f"{what}: {describe(result)}", file=sys.stderr, flush=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def measure_all(builds: list[Build], args: argparse.Namespace, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Every benchmark for every build; at each step the builds take turns, so noise lands on both."""
    postgres = not args.no_postgres and _postgres_available()
    if not args.no_postgres and not postgres:
        print("PostgreSQL server programs not found: no PostgreSQL figures", file=sys.stderr)
    nginx = False
    if not args.no_nginx:
        try:
            find_nginx()  # installed here, once, when missing: not inside a timed run
            nginx = True
        except RelayUnavailable as missing:
            print(f"no nginx relay figures: {missing}", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {build.name: {"runs": {}} for build in builds}
    for build in builds:
        (out_dir / build.name).mkdir(parents=True, exist_ok=True)

    def each(what: str, step: Callable[[Build, Path], None]) -> None:
        for build in builds:
            print(f"== {build.name}: {what} ...", file=sys.stderr, flush=True)
            step(build, out_dir / build.name)

    for name in targets.RUNS:
        each(
            f"run.py {name}",
            lambda b, d, n=name: results[b.name]["runs"].__setitem__(
                n, run_bench(b, n, args, d / f"run-{n}.json", postgres, nginx)
            ),
        )
    parts: list[tuple[str, str, Callable[[Build], dict[str, Any]], Callable[[dict[str, Any]], str]]] = [
        (
            "idle",
            f"{args.idle_sessions} idle sessions",
            lambda b: measure_idle_sessions(args.idle_sessions, bastion_cmd=b.cmd),
            describe_idle,
        ),
        (
            "verify",
            "verify",
            lambda b: measure_verify(args.verify_entries, bastion_cmd=b.cmd),
            describe_verify,
        ),
        (
            "soak",
            f"soak {args.soak_s:.0f} s",
            lambda b: run_soak(args.soak_s, sample_every_s=args.soak_sample_s, bastion_cmd=b.cmd),
            describe_soak,
        ),
    ]
    for key, what, measure, describe in parts:
        each(
            what,
            lambda b, d, k=key, w=what, m=measure, desc=describe: results[b.name].__setitem__(
                k, _step(w, lambda: m(b), desc, d / f"{k}.json")
            ),
        )
    return results


def _failed(results: dict[str, Any]) -> bool:
    runs = results["runs"].values()
    return (
        any("error" in run or run.get("exit_status") for run in runs)
        or any("error" in results.get(part, {}) for part in ("idle", "verify", "soak"))
        or bool(results.get("soak", {}).get("errors"))
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_signals()  # SIGTERM / SIGINT: the benchmark running stops what it started, then this exits
    try:
        return _table(args)
    except Terminated as stop:
        print(f"bench table: stopped by {stop}", file=sys.stderr)
        return 128 + stop.signum


def _table(args: argparse.Namespace) -> int:
    out_dir = args.out_dir or BENCH_DIR / "results" / f"{time.strftime('%Y%m%dT%H%M%S')}-table"
    out_dir.mkdir(parents=True, exist_ok=True)
    builds = [Build("after" if args.compare else "this build", args.bastion_cmd)]
    if args.compare:
        builds.insert(0, Build("before", args.compare))
    started = time.monotonic()
    results = measure_all(builds, args, out_dir)
    tables = {name: targets.rows(each) for name, each in results.items()}
    text = targets.render(tables)
    settings = {k: v for k, v in vars(args).items() if k != "out_dir"}
    (out_dir / "table.json").write_text(
        json.dumps(
            {
                "settings": settings,
                "builds": {b.name: b.cmd for b in builds},
                "took_s": round(time.monotonic() - started, 1),
                "rows": {name: [row.as_json() for row in rows] for name, rows in tables.items()},
            },
            indent=2,
        )
        + "\n"
    )
    (out_dir / "table.txt").write_text(text + "\n")
    print(text)
    print(f"\nwrote {out_dir}")
    return 1 if any(_failed(each) for each in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
