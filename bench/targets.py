"""The targets of DESIGN section 10 (issue #13), each read off one build's results, and the table of them.

``table.py`` gathers the results (the ``run.py`` runs, the idle-session,
soak and verify benchmarks) into one dict per build; :func:`rows` turns it
into one :class:`Row` per target, always the same rows in the same order (a
row whose figures are missing says why, with status ``n/a``); and
:func:`render` prints them, one build or two side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

__all__ = ["ROW_LABELS", "RUNS", "Row", "render", "rows"]

_MIB = 1 << 20

# The run.py runs behind the table: name -> (mode, execution ids, audit off + tracing + postgres beside it).
RUNS: dict[str, tuple[str, bool, bool]] = {
    "legacy-ids": ("legacy", True, True),
    "legacy": ("legacy", False, False),
    "modern-ids": ("modern", True, True),
    "modern": ("modern", False, False),
}
_ERA = {"legacy": "session era", "modern": "sessionless"}
# The run that also measures bastions on stores filled with a long history first (run.py --history).
HISTORY_RUN = "modern-ids"


@dataclass(frozen=True)
class Row:
    """One target: what it is, its goal, the figure measured, its context (ratio to direct), the verdict."""

    key: str
    label: str
    goal: str
    measured: str
    context: str
    status: str  # "meets", "MISSES" or "n/a"

    def as_json(self) -> dict[str, str]:
        return asdict(self)


class _Missing(Exception):
    """A figure a row needs is not in the results; the message says why."""


def _run(results: dict[str, Any], name: str) -> dict[str, Any]:
    run = results.get("runs", {}).get(name)
    if run is None:
        raise _Missing("not run")
    if "error" in run:
        raise _Missing(f"run failed: {run['error']}")
    return dict(run)


def _part(results: dict[str, Any], name: str) -> dict[str, Any]:
    part = results.get(name)
    if part is None:
        raise _Missing("not run")
    if "error" in part:
        raise _Missing(f"failed: {part['error']}")
    return dict(part)


def _verdict(ok: bool, errors: int = 0) -> str:
    return "meets" if ok and not errors else "MISSES"


def _errors_note(errors: int) -> str:
    return f"; {errors} failed calls" if errors else ""


def _throughput(name: str) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        through, direct = run["through"]["headline"], run["direct"]["headline"]
        ratio = run["compared"]["throughput_ratio"]
        errors = through["errors"] + direct["errors"]
        return (
            f"{ratio:.3f}x ({through['calls_per_s']:.0f} / {direct['calls_per_s']:.0f} calls/s)",
            f"through / direct, {through['errors']} + {direct['errors']} failed calls",
            _verdict(ratio >= 0.8, errors),
        )

    return figure


def _relay(name: str) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        if "bastion_vs_nginx" not in run:
            raise _Missing("no nginx relay measured (nginx missing, or --no-nginx)")
        versus, relay = run["bastion_vs_nginx"], run["through_nginx"]["headline"]
        through = run["through"]["headline"]
        return (
            f"{versus['throughput_ratio']:.3f}x "
            f"({through['calls_per_s']:.0f} / {relay['calls_per_s']:.0f} calls/s)",
            f"through / nginx relay; the relay is {run['compared_nginx']['throughput_ratio']:.3f}x direct"
            f"{_errors_note(relay['errors'])}",
            _verdict(versus["throughput_ratio"] >= 0.95, relay["errors"]),
        )

    return figure


def _relay_cpu(name: str) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        if "bastion_vs_nginx" not in run:
            raise _Missing("no nginx relay measured (nginx missing, or --no-nginx)")
        versus = run["bastion_vs_nginx"]
        cpu = run["through"]["headline"]["bastion_cpu_per_call_us"]
        return (
            f"{versus['cpu_ratio']:.2f}x ({cpu:.0f} / {versus['relay_cpu_per_call_us']:.0f} us)",
            "utime+stime per call, bastion / nginx (master and worker) in the same run",
            _verdict(versus["cpu_ratio"] <= 2.0),
        )

    return figure


def _history(key: str, which: str) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, HISTORY_RUN)
        if key not in run:
            raise _Missing(
                "no long-history store measured" + (" (PostgreSQL unavailable?)" if "pg" in key else "")
            )
        ratio = run[key][f"{which}_ratio"]
        filled = run["history"][key.replace("compared", "through")]
        ok = ratio >= 0.9 if which == "throughput" else ratio <= 1.1
        errors = run[key.replace("compared", "through")]["headline"]["errors"]
        return (
            f"{ratio:.3f}x",
            f"long history / fresh store, same rounds; {filled['entries']:,} entries and "
            f"{filled['executions']:,} executions written first{_errors_note(errors)}",
            _verdict(ok, errors),
        )

    return figure


def _latency(name: str, which: str, goal_ms: float) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        through, direct = run["through"]["headline"], run["direct"]["headline"]
        added = run["compared"][f"added_{which}_ms"]
        return (
            f"{added:+.2f} ms ({through[f'serial_{which}_ms']:.2f} vs {direct[f'serial_{which}_ms']:.2f})",
            f"{which} at concurrency 1, through minus direct",
            _verdict(added <= goal_ms),
        )

    return figure


def _cpu(name: str, through_key: str = "through") -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        if through_key not in run:
            raise _Missing("not measured (PostgreSQL unavailable?)")
        cpu = run[through_key]["headline"]["bastion_cpu_per_call_us"]
        upstream = run["direct"]["headline"]["upstream_cpu_per_call_us"]
        beside = ""
        if through_key != "through":
            beside = f"; SQLite {run['through']['headline']['bastion_cpu_per_call_us']:.0f} us"
        # A tiny run can see no clock tick of the upstream's CPU (10 ms resolution): no ratio then.
        ratio = f"{cpu / upstream:.2f}x upstream" if upstream > 0 else "upstream below clock resolution"
        return (
            f"{cpu:.0f} us ({ratio})",
            f"utime+stime per call; the upstream's own CPU per call direct is {upstream:.0f} us{beside}",
            _verdict(cpu <= 300),
        )

    return figure


def _audit(name: str) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        if "compared_audit" not in run:
            raise _Missing("not measured")
        ratio = run["compared_audit"]["throughput_ratio"]
        on, off = run["through"]["headline"], run["through_audit_off"]["headline"]
        return (
            f"{ratio:.3f}x ({on['calls_per_s']:.0f} / {off['calls_per_s']:.0f} calls/s)",
            "durable audit / audit off; audit off is "
            f"{run['compared_audit_off']['throughput_ratio']:.3f}x direct",
            _verdict(ratio >= 0.8, off["errors"]),
        )

    return figure


def _tracing(name: str) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        if "compared_tracing" not in run:
            raise _Missing("not measured")
        versus = run["compared_tracing"]
        on, off = run["through_tracing"]["headline"], run["through"]["headline"]
        # No span reached the receiver: the figure measures a Bastion that did not trace.
        exported = versus["spans_exported"] > 0 and not versus["exports_rejected"]
        return (
            f"{versus['cpu_ratio']:.3f}x ({on['bastion_cpu_per_call_us']:.0f} / "
            f"{off['bastion_cpu_per_call_us']:.0f} us)",
            f"CPU per call, tracing on / off; throughput {versus['throughput_ratio']:.3f}x, "
            f"{versus['spans_per_call']:.2f} spans exported per call, "
            f"{versus['exports_rejected']} exports rejected{_errors_note(on['errors'])}",
            _verdict(versus["cpu_ratio"] <= 1.1 and exported, on["errors"]),
        )

    return figure


def _postgres_throughput(name: str) -> Callable[[dict[str, Any]], tuple[str, str, str]]:
    def figure(results: dict[str, Any]) -> tuple[str, str, str]:
        run = _run(results, name)
        if "through_postgres" not in run:
            raise _Missing("not measured (PostgreSQL unavailable?)")
        on_pg, sqlite = run["through_postgres"]["headline"], run["through"]["headline"]
        ratio = run["compared_postgres"]["throughput_ratio"]
        return (
            f"{ratio:.3f}x ({on_pg['calls_per_s']:.0f} calls/s)",
            f"PostgreSQL through / direct; SQLite {run['compared']['throughput_ratio']:.3f}x "
            f"({sqlite['calls_per_s']:.0f} calls/s) in the same run{_errors_note(on_pg['errors'])}",
            _verdict(ratio >= 0.8, on_pg["errors"]),
        )

    return figure


def _ready(results: dict[str, Any]) -> tuple[str, str, str]:
    runs = [run for run in results.get("runs", {}).values() if "bastion_ready_s" in run]
    if not runs:
        raise _Missing("no bastion started")
    starts = [run["bastion_ready_s"] for run in runs]
    upstream = median(run["upstream_ready_s"] for run in runs)
    worst = max(starts)
    return (
        f"{median(starts):.2f} s median",
        f"{len(starts)} starts, worst {worst:.2f} s; the upstream alone {upstream:.2f} s",
        _verdict(worst <= 2.0),
    )


def _idle(results: dict[str, Any]) -> tuple[str, str, str]:
    idle = _part(results, "idle")
    how = "measured" if not idle["rss_at_10000_extrapolated"] else f"from {idle['sessions_opened']:,}"
    return (
        f"{idle['rss_at_10000_bytes'] / _MIB:.0f} MiB ({how})",
        f"{idle['rss_before_bytes'] / _MIB:.0f} MiB warm, "
        f"+{idle['per_session_bytes'] / 1024:.1f} KiB/session",
        _verdict(idle["meets"]),
    )


def _soak(results: dict[str, Any]) -> tuple[str, str, str]:
    soak = _part(results, "soak")
    return (
        f"{soak['growth_ratio']:+.1%} over {soak['duration_s']:.0f} s",
        f"{soak['warm_rss_bytes'] / _MIB:.0f} -> {soak['end_rss_bytes'] / _MIB:.0f} MiB, "
        f"{soak['calls']:,} calls at {soak['calls_per_s']:.0f}/s{_errors_note(soak['errors'])}",
        _verdict(soak["flat"], soak["errors"]),
    )


def _verify_rate(results: dict[str, Any]) -> tuple[str, str, str]:
    verify = _part(results, "verify")
    rate = verify["entries_per_s"]
    biggest = verify["runs"][-1]
    return (
        f"{rate:,} entries/s (CPU)",
        f"{rate / 200_000:.2f}x the target; {verify.get('entries_per_wall_s', 0):,} per wall second "
        f"pinned to one CPU, --jobs 1, {biggest['entries']:,} entries",
        _verdict(verify["meets_rate"]),
    )


def _verify_memory(results: dict[str, Any]) -> tuple[str, str, str]:
    verify = _part(results, "verify")
    first, last = verify["runs"][0], verify["runs"][-1]
    return (
        f"peak RSS {verify['peak_rss_growth_ratio']:+.1%}",
        f"{first['peak_rss_bytes'] / _MIB:.0f} MiB at {first['bundle_bytes'] / _MIB:.0f} MiB bundle, "
        f"{last['peak_rss_bytes'] / _MIB:.0f} MiB at {last['bundle_bytes'] / _MIB:.0f} MiB",
        _verdict(verify["memory_flat"]),
    )


def _target_table() -> list[tuple[str, str, str, Callable[[dict[str, Any]], tuple[str, str, str]]]]:
    table: list[tuple[str, str, str, Callable[[dict[str, Any]], tuple[str, str, str]]]] = []
    for name, (mode, ids, _) in RUNS.items():
        label = f"throughput, {_ERA[mode]}, execution ids {'on' if ids else 'off'}"
        table.append((f"throughput-{name}", label, ">= 0.8x direct", _throughput(name)))
    for name, (mode, ids, _) in RUNS.items():
        label = f"throughput vs nginx relay, {_ERA[mode]}, execution ids {'on' if ids else 'off'}"
        table.append((f"relay-{name}", label, ">= 0.95x nginx", _relay(name)))
    for name in ("legacy-ids", "modern-ids"):
        era = _ERA[RUNS[name][0]]
        table.append(
            (f"p50-{name}", f"added p50 at concurrency 1, {era}", "<= 1 ms", _latency(name, "p50", 1.0))
        )
        table.append(
            (f"p99-{name}", f"added p99 at concurrency 1, {era}", "<= 5 ms", _latency(name, "p99", 5.0))
        )
    for name in ("legacy-ids", "modern-ids"):
        era = _ERA[RUNS[name][0]]
        table.append((f"cpu-{name}", f"bastion CPU per call, {era}", "<= 300 us", _cpu(name)))
        table.append(
            (f"relay-cpu-{name}", f"bastion CPU per call vs nginx, {era}", "<= 2x nginx", _relay_cpu(name))
        )
    for name in ("legacy-ids", "modern-ids"):
        era = _ERA[RUNS[name][0]]
        table.append(
            (f"audit-{name}", f"durable audit vs audit off, {era}", ">= 0.8x audit off", _audit(name))
        )
        table.append(
            (f"tracing-{name}", f"tracing on vs off, CPU per call, {era}", "<= 1.1x off", _tracing(name))
        )
    table += [
        ("idle-sessions", "10,000 idle session-era sessions, RSS", "<= 1024 MiB", _idle),
        ("soak", "memory over a soak at full load", "flat (<= +10%)", _soak),
        ("verify-rate", "bastion verify, one core", ">= 200,000 entries/s", _verify_rate),
        ("verify-memory", "bastion verify memory vs bundle size", "flat (<= +25%)", _verify_memory),
        ("ready", "start to ready", "<= 2 s", _ready),
    ]
    history_era = _ERA[RUNS[HISTORY_RUN][0]]
    for engine, key in (("SQLite", "compared_history"), ("PostgreSQL", "compared_postgres_history")):
        slug = "history" if engine == "SQLite" else "pg-history"
        table.append(
            (
                f"{slug}-throughput",
                f"{engine}: throughput, long history vs fresh, {history_era}",
                ">= 0.9x fresh",
                _history(key, "throughput"),
            )
        )
        table.append(
            (
                f"{slug}-cpu",
                f"{engine}: CPU per call, long history vs fresh, {history_era}",
                "<= 1.1x fresh",
                _history(key, "cpu"),
            )
        )
    for name in ("legacy-ids", "modern-ids"):
        era = _ERA[RUNS[name][0]]
        table.append(
            (
                f"pg-throughput-{name}",
                f"PostgreSQL: throughput, {era}",
                ">= 0.8x direct",
                _postgres_throughput(name),
            )
        )
        table.append(
            (
                f"pg-cpu-{name}",
                f"PostgreSQL: bastion CPU per call, {era}",
                "<= 300 us",
                _cpu(name, "through_postgres"),
            )
        )
    return table


_TARGETS = _target_table()
ROW_LABELS = tuple(label for _, label, _, _ in _TARGETS)


def rows(results: dict[str, Any]) -> list[Row]:
    """One row per target, in the table's order, from one build's results."""
    out = []
    for key, label, goal, figure in _TARGETS:
        try:
            measured, context, status = figure(results)
        except _Missing as missing:
            measured, context, status = "-", str(missing), "n/a"
        except (KeyError, TypeError, ZeroDivisionError, IndexError) as exc:
            measured, context, status = "-", f"results incomplete: {exc!r}", "n/a"
        out.append(Row(key, label, goal, measured, context, status))
    return out


def _lay_out(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    rule = ["-" * w for w in widths]
    return "\n".join(
        "  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(line)).rstrip()
        for line in [header, rule, *body]
    )


def render(tables: dict[str, list[Row]]) -> str:
    """One build: target, goal, measured, context, status. Several: measured and status per build."""
    if len(tables) == 1:
        (only,) = tables.values()
        return _lay_out(
            ["target", "goal", "measured", "status", "ratio to direct / context"],
            [[r.label, r.goal, r.measured, r.status, r.context] for r in only],
        )
    builds = list(tables)
    header = ["target", "goal"]
    for build in builds:
        header += [build, ""]
    body = []
    for i, first in enumerate(tables[builds[0]]):
        line = [first.label, first.goal]
        for build in builds:
            row = tables[build][i]
            line += [row.measured, row.status]
        body.append(line)
    text = _lay_out(header, body)
    notes = [f"\n{build}: ratio to direct / context" for build in builds]
    for build, note in zip(builds, notes, strict=True):
        text += note + "\n" + "\n".join(f"  {r.label}: {r.context}" for r in tables[build])
    return text
