"""Operations on rate-limit token buckets (see ``store/token_buckets.py``).

Each bucket's row is made to exist (inserted full, or left as it is) and then
read ``FOR UPDATE`` (PostgreSQL), in key order so two calls that need the same
buckets never deadlock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bastion.store.statements import Op, count, execute, one
from bastion.store.token_buckets import BucketTake, TokensRefused

_US = 1_000_000


def take_tokens(buckets: Sequence[BucketTake], now_us: int) -> Op[TokensRefused | None]:
    levels: dict[int, tuple[float, int]] = {}
    for index in sorted(range(len(buckets)), key=lambda i: buckets[i].key):
        bucket = buckets[index]
        # A new bucket is inserted full before it is locked: an upsert alone would let two
        # replicas that both found no row each write its own level over the other's.
        yield from execute(
            "INSERT INTO token_buckets (bucket, tokens, updated_us, full_at_us) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (bucket) DO NOTHING",
            bucket.key, float(bucket.capacity), now_us, now_us,
        )  # fmt: skip
        row = yield from one(
            "SELECT tokens, updated_us FROM token_buckets WHERE bucket = ?", bucket.key, lock="FOR UPDATE"
        )
        levels[index] = _level(bucket, row, now_us)
    for index, bucket in enumerate(buckets):
        level, _ = levels[index]
        if level < 1.0:
            return TokensRefused(index, round((1.0 - level) / bucket.refill_per_s, 3))
    for index, bucket in enumerate(buckets):
        level, stamp = levels[index]
        left = level - 1.0
        full_at = stamp + math.ceil((bucket.capacity - left) / bucket.refill_per_s * _US)
        yield from execute(
            "INSERT INTO token_buckets (bucket, tokens, updated_us, full_at_us) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (bucket) DO UPDATE SET tokens = excluded.tokens, updated_us = excluded.updated_us,"
            " full_at_us = excluded.full_at_us",
            bucket.key, left, stamp, full_at,
        )  # fmt: skip
    return None


def _level(bucket: BucketTake, row: tuple[Any, ...] | None, now_us: int) -> tuple[float, int]:
    """Tokens in the bucket at ``now_us``, and the time that level is as of."""
    if row is None:
        return float(bucket.capacity), now_us
    tokens, then_us = float(row[0]), int(row[1])
    if now_us <= then_us:
        return tokens, then_us
    refilled = tokens + (now_us - then_us) / _US * bucket.refill_per_s
    return min(float(bucket.capacity), refilled), now_us


def refund_tokens(buckets: Sequence[BucketTake], now_us: int) -> Op[None]:
    """Give one token back to each bucket that exists, capped at its capacity."""
    for bucket in sorted(buckets, key=lambda b: b.key):
        row = yield from one(
            "SELECT tokens, updated_us FROM token_buckets WHERE bucket = ?", bucket.key, lock="FOR UPDATE"
        )
        if row is None:
            continue  # forgotten because full: nothing to give back
        level, stamp = _level(bucket, row, now_us)
        level = min(float(bucket.capacity), level + 1.0)
        full_at = stamp + math.ceil((bucket.capacity - level) / bucket.refill_per_s * _US)
        yield from execute(
            "UPDATE token_buckets SET tokens = ?, updated_us = ?, full_at_us = ? WHERE bucket = ?",
            level, stamp, full_at, bucket.key,
        )  # fmt: skip


def prune_token_buckets(now_us: int) -> Op[int]:
    return (yield from count("DELETE FROM token_buckets WHERE full_at_us <= ?", now_us))
