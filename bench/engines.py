"""The engine comparison of ``bench/run.py --postgres`` (issue #10): SQLite and PostgreSQL, one replica each.

The PostgreSQL bastion runs on a throwaway cluster started here (durable:
``fsync`` and ``synchronous_commit`` on, as production would run) unless
``--store URL`` names a database. Both bastions see the same load in the same
rounds; the figures compared are the through-bastion numbers of each engine,
and the store operations each needs per governed call (``store_ops.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import repo_path  # noqa: F401  (puts the repository root on sys.path: tests.support)
from loadgen import Mode
from store_ops import count_store_ops
from tests.support.pg_cluster import ThrowawayCluster

__all__ = ["engine_ratios", "postgres_url", "render_engines", "stop_postgres", "store_ops_both"]

_cluster: list[ThrowawayCluster] = []  # the bench's one throwaway cluster (a script, not the gateway)


def postgres_url(args: argparse.Namespace, temp: Path, database: str = "bench") -> str:
    """``--store``, or ``database`` of a throwaway durable cluster started on first use."""
    if args.store:
        return str(args.store)
    if not _cluster:
        _cluster.append(ThrowawayCluster.start(durable=True))
        _cluster[0].psql("CREATE DATABASE bench")
        _cluster[0].psql("CREATE DATABASE bench_ops")
        _cluster[0].psql("CREATE DATABASE bench_history")
    return _cluster[0].dsn(database)


def stop_postgres() -> None:
    while _cluster:
        _cluster.pop().stop()


def engine_ratios(sqlite: dict[str, Any], postgres: dict[str, Any]) -> dict[str, float]:
    """PostgreSQL against SQLite, one replica each: throughput ratio and added latency."""
    s, p = sqlite["headline"], postgres["headline"]
    return {
        "throughput_ratio": round(p["calls_per_s"] / s["calls_per_s"], 3),
        "added_p50_ms": round(p["serial_p50_ms"] - s["serial_p50_ms"], 3),
        "added_p99_ms": round(p["serial_p99_ms"] - s["serial_p99_ms"], 3),
        "added_bastion_cpu_per_call_us": round(
            p["bastion_cpu_per_call_us"] - s["bastion_cpu_per_call_us"], 1
        ),
    }


async def store_ops_both(
    args: argparse.Namespace, temp: Path, upstream_url: str, mode: Mode, url: str
) -> dict[str, Any]:
    """Store work per governed call on each engine, each on a fresh store of its own."""
    ops_url = url if args.store else _cluster[0].dsn("bench_ops")
    counted = {}
    for engine, store_url in (("sqlite", None), ("postgres", ops_url)):
        data_dir = temp / f"data-ops-{engine}"
        data_dir.mkdir()
        counted[engine] = await count_store_ops(
            engine=engine,
            store_url=store_url,
            data_dir=data_dir,
            upstream_url=upstream_url,
            mode=mode,
            calls=args.store_ops_calls,
            execution_ids=args.execution_ids,
        )
    return counted


def render_engines(results: dict[str, Any]) -> str:
    s, p = results["through"]["headline"], results["through_postgres"]["headline"]
    r = results["postgres_vs_sqlite"]
    ops = results.get("store_ops_per_call")
    rows = [
        ["", "sqlite", "postgres", "postgres/sqlite"],
        ["calls/s", f"{s['calls_per_s']:.1f}", f"{p['calls_per_s']:.1f}", f"{r['throughput_ratio']:.3f}x"],
        ["p50 ms (conc. 1)", f"{s['serial_p50_ms']:.3f}", f"{p['serial_p50_ms']:.3f}",
         f"{r['added_p50_ms']:+.3f} ms"],
        ["p99 ms (conc. 1)", f"{s['serial_p99_ms']:.3f}", f"{p['serial_p99_ms']:.3f}",
         f"{r['added_p99_ms']:+.3f} ms"],
        ["bastion CPU/call us", f"{s['bastion_cpu_per_call_us']:.1f}", f"{p['bastion_cpu_per_call_us']:.1f}",
         f"{r['added_bastion_cpu_per_call_us']:+.1f} us"],
    ]  # fmt: skip
    for key, label in (
        ()
        if ops is None
        else (
            ("store_methods_per_call", "store calls/call"),
            ("statements_per_call", "SQL statements/call"),
            ("write_transactions_per_call", "write txns/call"),
        )
    ):
        rows.append([label, f"{ops['sqlite'][key]:.2f}", f"{ops['postgres'][key]:.2f}", ""])
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(f"{c:<{widths[i]}}" if i in (0, 3) else f"{c:>{widths[i]}}" for i, c in enumerate(row))
             for row in rows]  # fmt: skip
    if ops is None:
        return "\n".join(line.rstrip() for line in lines)
    methods = sorted(set(ops["sqlite"]["by_method"]) | set(ops["postgres"]["by_method"]))
    lines.append("store calls per governed call, by method (sqlite / postgres):")
    lines += [
        f"  {m}: {ops['sqlite']['by_method'].get(m, 0):.2f} / {ops['postgres']['by_method'].get(m, 0):.2f}"
        for m in methods
    ]
    return "\n".join(line.rstrip() for line in lines)
