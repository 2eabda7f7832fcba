"""The serving process's collector settings (heap.py): survivors frozen, cyclic garbage still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from bastion.heap import YOUNG_THRESHOLD, settle_after_start


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_survivors_are_frozen_and_the_young_threshold_raised(restored_collector: None) -> None:
    """What lives at the call is moved out of the collector's scans; the older thresholds stay."""
    held = [_Node() for _ in range(100)]
    _, middle, old = gc.get_threshold()
    settle_after_start()
    assert gc.get_freeze_count() >= len(held)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, middle, old)


def test_cyclic_garbage_made_after_start_is_still_collected(restored_collector: None) -> None:
    """A reference cycle dropped after the settle is reclaimed once enough garbage builds up."""
    settle_after_start()
    first, second = _Node(), _Node()
    first.peer, second.peer = second, first
    gone = weakref.ref(first)
    del first, second
    assert gone() is not None  # a cycle: reference counting alone never frees it
    # Enough further cyclic garbage to pass the young threshold: the collector runs by itself.
    for _ in range(YOUNG_THRESHOLD):
        a, b = _Node(), _Node()
        a.peer, b.peer = b, a
    del a, b
    assert gone() is None
