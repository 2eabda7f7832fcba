"""``make bench``'s table (bench/table.py, issue #13): every target of DESIGN section 10 gets a row.

The quick table runs end to end through the real CLI (``bastion serve``,
``bastion verify``, the example upstream) with tiny counts. Only the shape is
asserted: which rows exist and that each benchmark behind them ran; never a
speed (the bench reports targets, the tests do not judge them).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.e2e.conftest import Upstream
from tests.support.pg_cluster import PostgresUnavailable, find_bindir

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--quick",
    "--sessions", "2", "--calls", "10", "--warmup", "2", "--latency-calls", "5",
    "--history-entries", "200", "--idle-sessions", "10", "--soak-s", "2", "--soak-sample-s", "0.5",
    "--verify-entries", "50", "500",
]  # fmt: skip
EXPECTED_KEYS = [
    "throughput-legacy-ids",
    "throughput-legacy",
    "throughput-modern-ids",
    "throughput-modern",
    "relay-legacy-ids",
    "relay-legacy",
    "relay-modern-ids",
    "relay-modern",
    "p50-legacy-ids",
    "p99-legacy-ids",
    "p50-modern-ids",
    "p99-modern-ids",
    "cpu-legacy-ids",
    "relay-cpu-legacy-ids",
    "cpu-modern-ids",
    "relay-cpu-modern-ids",
    "audit-legacy-ids",
    "tracing-legacy-ids",
    "audit-modern-ids",
    "tracing-modern-ids",
    "idle-sessions",
    "soak",
    "verify-rate",
    "verify-memory",
    "ready",
    "history-throughput",
    "history-cpu",
    "pg-history-throughput",
    "pg-history-cpu",
    "pg-throughput-legacy-ids",
    "pg-cpu-legacy-ids",
    "pg-throughput-modern-ids",
    "pg-cpu-modern-ids",
]


def _postgres_available() -> bool:
    try:
        find_bindir()
    except PostgresUnavailable:
        return False
    return True


def _bench_module(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A module of bench/ loaded from its file (bench/ is not a package and not on sys.path).

    It is registered in ``sys.modules`` for the test only: its dataclasses look their module up there.
    """
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def _bench(script: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script>`` from the repository, output captured, bounded by ``timeout_s``."""
    command = [sys.executable, str(REPO / "bench" / script), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)


@pytest.mark.timeout(900)
def test_quick_table_has_a_row_for_every_target(tmp_path: Path) -> None:
    """A tiny quick run prints one row per target and writes them, each measured, as JSON."""
    out_dir = tmp_path / "results"
    done = _bench("table.py", *TINY, "--out-dir", str(out_dir), timeout_s=840)
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads((out_dir / "table.json").read_text())
    (rows,) = table["rows"].values()
    assert [row["key"] for row in rows] == EXPECTED_KEYS
    for row in rows:
        assert row["label"] in done.stdout
        expected = {"meets", "MISSES"}
        if row["key"].startswith("pg-") and not _postgres_available():
            expected = {"n/a"}
        assert row["status"] in expected, row
    for name in ("run-legacy-ids", "run-legacy", "run-modern-ids", "run-modern", "idle", "verify", "soak"):
        assert (out_dir / "this build" / f"{name}.json").is_file()
    for name in ("run-legacy-ids", "run-modern-ids"):
        # The traced Bastion really exported its spans to the receiver, which decoded every body.
        tracing = json.loads((out_dir / "this build" / f"{name}.json").read_text())["compared_tracing"]
        assert tracing["spans_exported"] > 0 and tracing["exports_rejected"] == 0, tracing


def test_two_builds_are_shown_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """With two builds the table has each build's figure and status in its own columns, row by row."""
    targets = _bench_module("targets", monkeypatch)
    before = targets.rows({"runs": {}})
    after = targets.rows({"runs": {}, "verify": {"error": "boom"}})
    text = targets.render({"before": before, "after": after})
    header = text.splitlines()[0].split()
    assert header[:4] == ["target", "goal", "before", "after"]
    for label in targets.ROW_LABELS:
        assert label in text
    assert "failed: boom" in text
    assert {row.status for row in before} == {"n/a"}


@pytest.mark.parametrize("mode", ["legacy", "modern"])
def test_instructions_driver_makes_its_calls_through_and_direct(tools_upstream: Upstream, mode: str) -> None:
    """bench/instructions.py makes every call asked, through a gateway and straight to the upstream."""
    port = tools_upstream.url.split(":")[-1].split("/")[0]
    for extra in ([], ["--direct"]):
        done = _bench("instructions.py", "--upstream-port", port, "--mode", mode, "--calls", "4", *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "calls 4 errors 0" in done.stderr
