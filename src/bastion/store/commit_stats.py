"""What a store's commits cost, for ``/metrics`` (issue #25): a histogram kept by the writer.

Plain counts, not a Prometheus object: the store knows nothing of a registry (``metrics.py``
reads these at scrape). One writer updates a histogram (the SQLite writer thread); a scrape
reads it from another thread, so a scrape may see one observation half-counted (its bucket
but not yet its sum), never a corrupt value.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from types import TracebackType
from typing import Any

__all__ = ["BATCH_BUCKETS", "COMMIT_BUCKETS", "CountHistogram", "TimedCommit"]

#: Seconds of one COMMIT (the fsync): from a page-cache write to a struggling disk.
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: Writes per committed transaction (group commit; the SQLite store's max_batch is 256).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class CountHistogram:
    """Observations counted into fixed buckets (upper bounds, inclusive), with their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as Prometheus histograms give them, ``+Inf`` last."""
        running, pairs = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), list(self.counts), strict=True):
            running += count
            pairs.append((bound, float(running)))
        return pairs


class TimedCommit:
    """``async with`` around a driver's transaction that times its commit (an exit without an
    exception) into ``histogram``; a rollback is not timed. Otherwise the transaction's own."""

    __slots__ = ("_histogram", "_transaction")

    def __init__(self, transaction: Any, histogram: CountHistogram) -> None:
        self._transaction, self._histogram = transaction, histogram

    async def __aenter__(self) -> Any:
        return await self._transaction.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if exc is not None:
            return await self._transaction.__aexit__(kind, exc, tb)  # type: ignore[no-any-return]
        committing = time.perf_counter()
        result = await self._transaction.__aexit__(None, None, None)
        self._histogram.observe(time.perf_counter() - committing)
        return result  # type: ignore[no-any-return]
