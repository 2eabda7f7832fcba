"""Rate-limit token buckets in the store (issue #10): one bucket for every replica, taken atomically."""

from __future__ import annotations

import anyio
import pytest
from store_support import later

from bastion.store.base import Store
from bastion.store.token_buckets import BucketTake, TokensRefused

pytestmark = pytest.mark.anyio

PER_MINUTE = BucketTake("grant-a|agent-1|tools|count", 3, 60.0)
OTHER = BucketTake("grant-b|agent-1|tools|count", 5, 60.0)


async def test_a_bucket_allows_its_capacity_then_refuses_with_a_retry_hint(store: Store) -> None:
    """3/minute: three takes succeed at once, the fourth is refused for 20 s (one token's refill)."""
    for _ in range(3):
        assert await store.take_tokens([PER_MINUTE], now=later(0)) is None
    refused = await store.take_tokens([PER_MINUTE], now=later(0))
    assert refused == TokensRefused(0, 20.0)


async def test_a_bucket_refills_continuously(store: Store) -> None:
    """After one token's refill time a spent bucket allows exactly one more take."""
    for _ in range(3):
        await store.take_tokens([PER_MINUTE], now=later(0))
    assert await store.take_tokens([PER_MINUTE], now=later(20)) is None
    refused = await store.take_tokens([PER_MINUTE], now=later(20))
    assert refused is not None and refused.retry_after_s == 20.0


async def test_a_take_is_all_or_none(store: Store) -> None:
    """When one bucket of a call is empty, no token is taken from the others."""
    for _ in range(3):
        await store.take_tokens([PER_MINUTE], now=later(0))
    refused = await store.take_tokens([OTHER, PER_MINUTE], now=later(0))
    assert refused is not None and refused.index == 1
    for _ in range(5):  # OTHER still holds all five
        assert await store.take_tokens([OTHER], now=later(0)) is None
    assert await store.take_tokens([OTHER], now=later(0)) is not None


async def test_a_clock_that_steps_back_refills_nothing(store: Store) -> None:
    """A take stamped before the bucket's last update sees the level as of that update."""
    for _ in range(3):
        await store.take_tokens([PER_MINUTE], now=later(30))
    assert await store.take_tokens([PER_MINUTE], now=later(0)) is not None


async def test_racing_takes_on_two_replicas_never_overspend(store: Store, replica: Store) -> None:
    """40 concurrent takes of a 7-token bucket, split over two replicas: exactly 7 succeed."""
    bucket = BucketTake("race", 7, 3600.0)
    taken: list[bool] = []

    async def take(target: Store) -> None:
        taken.append(await target.take_tokens([bucket], now=later(0)) is None)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(take, store if i % 2 else replica)
    assert taken.count(True) == 7 and len(taken) == 40


async def test_prune_forgets_only_full_buckets(store: Store) -> None:
    """A bucket is forgotten once it is full again; one still refilling is kept."""
    await store.take_tokens([PER_MINUTE], now=later(0))
    await store.take_tokens([OTHER], now=later(10))
    assert await store.prune_token_buckets(now=later(21)) == 1  # PER_MINUTE refilled at 20 s
    assert await store.prune_token_buckets(now=later(21)) == 0  # OTHER is not full before 22 s
    for _ in range(4):  # OTHER kept its level: 4 tokens, plus a fraction refilled
        assert await store.take_tokens([OTHER], now=later(21)) is None
    assert await store.take_tokens([OTHER], now=later(21)) is not None


async def test_one_bucket_named_twice_is_refused(store: Store) -> None:
    """A take that names one bucket twice is a caller error, not two tokens."""
    with pytest.raises(ValueError):
        await store.take_tokens([PER_MINUTE, PER_MINUTE], now=later(0))


async def test_a_refund_gives_one_token_back_capped_at_capacity(store: Store) -> None:
    """A refunded token can be taken again at once; refunds never fill a bucket past its capacity."""
    for _ in range(3):
        await store.take_tokens([PER_MINUTE], now=later(0))
    await store.refund_tokens([PER_MINUTE], now=later(0))
    assert await store.take_tokens([PER_MINUTE], now=later(0)) is None
    assert await store.take_tokens([PER_MINUTE], now=later(0)) is not None
    for _ in range(5):
        await store.refund_tokens([OTHER], now=later(0))  # OTHER was never taken from: no row, no-op
    for _ in range(5):
        assert await store.take_tokens([OTHER], now=later(0)) is None
    assert await store.take_tokens([OTHER], now=later(0)) is not None
