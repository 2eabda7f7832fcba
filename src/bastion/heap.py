"""The collector's settings for a serving process, set once start-up is done (issue #13).

Start-up leaves about 100,000 long-lived objects behind (modules, schemas, the
policy snapshot, the SDK's models). Python's cyclic collector scanned all of
them at each full collection: 55 ms a time, three times per 3,000 governed
calls, a pause that lands on whichever calls are in flight. Young collections
ran every 700 container allocations, a few times per call, though nearly
everything a call allocates is freed by reference counting. Together: about
90 µs of CPU per governed call (``gc.callbacks`` timing under ``bench/run.py``).

:func:`settle_after_start` collects once, freezes what survived (never scanned
again), and raises the young generation's threshold so that a collection runs
when cyclic garbage has built up, not on every burst of short-lived objects.
Cyclic garbage is still collected; what waits for it is bounded by the threshold.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_after_start"]

YOUNG_THRESHOLD = 5000
"""Net container allocations between young collections (CPython's default: 700)."""


def settle_after_start() -> None:
    """Collect, freeze the survivors of start-up, and raise the young threshold (keeping the others)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
