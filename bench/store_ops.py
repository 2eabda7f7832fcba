"""Store operations per governed call, on each engine (issue #10): what one ``tools/call`` asks of the store.

A gateway runs in this process (the real app on a loopback socket, built as
``bastion serve`` builds it) with its store wrapped in :class:`CountingStore`,
which counts every contract method called; the engine under it counts the SQL
statements it sent and the write transactions it committed. One session makes
``calls`` calls to the upstream's echo tool; the figures are per call, over
the measured calls only (warm-up excluded). Heartbeats run meanwhile: a
handful of operations over the whole phase, a rounding error per call.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import repo_path  # noqa: F401  (puts the repository root on sys.path: tests.support)
from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from loadgen import Mode, Target, run_phase
from tests.support.loopback import serve_on_loopback

__all__ = ["CountingStore", "count_store_ops"]


class CountingStore:
    """Passes every call through to ``inner`` and counts the coroutine methods called, by name."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or name == "aclose" or not callable(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await attr(*args, **kwargs)

        return counted


def _engine_counters(store: Any) -> dict[str, int]:
    return {
        "statements": int(getattr(store, "statements_run", 0)),
        "write_transactions": int(getattr(store, "committed_transactions", 0)),
    }


async def count_store_ops(
    *,
    engine: str,
    store_url: str | None,
    data_dir: Path,
    upstream_url: str,
    mode: Mode,
    calls: int,
    execution_ids: bool,
) -> dict[str, Any]:
    """Run ``calls`` governed calls through an in-process gateway and return the store's work per call."""
    token = secrets.token_urlsafe(32)
    config = {
        "servers": {"tools": {"url": upstream_url}},
        "agents": {"bench": {"token_sha256": hashlib.sha256(token.encode()).hexdigest()}},
    }
    snapshot = snapshot_from_mapping(config, source=None, version=f"store-ops-{engine}")
    counting: list[CountingStore] = []

    def wrap(store: Any) -> Any:
        counting.append(CountingStore(store))
        return counting[0]

    options = RuntimeOptions(
        data_dir=data_dir, store_url=store_url, generation=f"store-ops-{engine}", store_factory=wrap
    )
    before: dict[str, Any] = {}

    def mark() -> None:
        before["calls"] = Counter(counting[0].calls)
        before["engine"] = _engine_counters(counting[0].inner)

    async with serve_on_loopback(create_app(snapshot, options)) as url:
        target = Target(
            f"store-ops-{engine}",
            url,
            "tools__echo",
            headers={"authorization": f"Bearer {token}"},
            execution_ids=execution_ids,
        )
        phase = await run_phase(
            target, mode, sessions=1, warmup_calls=20, calls=calls, timeout_s=30.0, on_measure_start=mark
        )
        after_calls = Counter(counting[0].calls)
        after_engine = _engine_counters(counting[0].inner)
    done = phase.calls - phase.errors

    def per(n: float) -> float:
        return round(n / done, 3) if done else float("nan")

    by_method = {name: per(n) for name, n in sorted((after_calls - before["calls"]).items())}
    return {
        "engine": engine,
        "calls": done,
        "errors": phase.errors,
        "store_methods_per_call": per(sum((after_calls - before["calls"]).values())),
        "by_method": by_method,
        "statements_per_call": per(after_engine["statements"] - before["engine"]["statements"]),
        "write_transactions_per_call": per(
            after_engine["write_transactions"] - before["engine"]["write_transactions"]
        ),
    }
