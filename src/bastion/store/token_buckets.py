"""Rate-limit token buckets in the store, shared by every replica (DESIGN section 2 step 4, issue #10).

A grant's ``rate`` is a token bucket per grant, agent, server and tool. Held
in one replica's memory, N replicas would allow N times the rate; held here,
one atomic write takes a token from every bucket a call needs, or from none,
whichever replica serves the call. Times are wall-clock (replicas share no
monotonic clock): a replica whose clock is ahead spends tokens refilled
early, by at most its skew times the refill rate.

Unfenced, by decision: taking a token only ever refuses more (the
fail-closed direction), and a stale replica taking one cannot let anyone write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

__all__ = ["BucketTake", "TokenBucketStore", "TokensRefused"]


@dataclass(frozen=True, slots=True)
class BucketTake:
    """One token wanted from bucket ``key``, which holds ``capacity`` tokens refilled over ``period_s``."""

    key: str
    capacity: int
    period_s: float

    def __post_init__(self) -> None:
        if not self.key or self.capacity < 1 or not self.period_s > 0:
            raise ValueError("a bucket needs a key, a capacity of at least 1 and a positive period")

    @property
    def refill_per_s(self) -> float:
        return self.capacity / self.period_s


@dataclass(frozen=True, slots=True)
class TokensRefused:
    """No token was taken: bucket ``index`` (of the request) is empty for ``retry_after_s`` more seconds."""

    index: int
    retry_after_s: float


class TokenBucketStore(Protocol):
    async def take_tokens(self, buckets: Sequence[BucketTake], *, now: datetime) -> TokensRefused | None:
        """Take one token from every bucket, or from none, in one transaction; ``None`` when taken.

        A bucket never seen is full. A bucket refills continuously up to its
        capacity; a ``now`` before its last update refills nothing (a clock that
        steps back never counts time twice). Concurrent takes from any replica
        serialize on the buckets' rows, so a bucket never goes below zero.
        """
        ...

    async def refund_tokens(self, buckets: Sequence[BucketTake], *, now: datetime) -> None:
        """Give back one token to each bucket (capped at capacity): a call refused before its send."""
        ...

    async def prune_token_buckets(self, *, now: datetime) -> int:
        """Forget buckets full again at ``now`` (forgetting changes no decision); returns how many."""
        ...
