"""Grant rate limits taken from the store, so every replica spends from the same buckets (issue #10).

:class:`StoreRateLimiter` turns a decision's ``limits`` into the store's
token buckets (one per grant, rate, agent, server and tool, as the in-memory
:class:`~bastion.policy.decide.RateLimiter` keys them) and takes one token
from each in one atomic write, or from none. A bucket's key is a digest: it
names no agent or tool in the store. Full buckets are forgotten now and then
(at most once a minute per limiter), which changes no decision.

Fail closed: when the store cannot take the tokens, the call is refused with
the store's error; it is never allowed unmetered.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime

import anyio

from bastion.errors import RateLimited, StoreError
from bastion.policy.decide import rate_limited
from bastion.policy.grants import Rate
from bastion.store.token_buckets import BucketTake, TokenBucketStore

__all__ = ["StoreRateLimiter", "bucket_key"]

_PRUNE_EVERY_S = 60.0
_REFUND_BOUND_S = 5.0


def bucket_key(grant: str, rate: Rate, agent: str, server: str, tool: str) -> str:
    """The store key of one bucket: a reload that keeps a grant's name and rate keeps its buckets."""
    parts = (grant, str(rate.tokens), repr(rate.period_s), agent, server, tool)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class StoreRateLimiter:
    """Takes grant rate-limit tokens from the store; owned by one gateway, sharing its buckets with all."""

    def __init__(self, store: TokenBucketStore, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock
        self._pruned_at: datetime | None = None

    async def take(
        self,
        limits: Sequence[tuple[str, Rate]],
        agent: str,
        server: str,
        tool: str,
        *,
        policy_version: str,
    ) -> None:
        """Take one token from every bucket in ``limits``, or from none.

        Raises:
            RateLimited: some bucket is empty; ``retry_after_s`` says when it has a token again.
            StoreError: the store could not take them (the call must be refused).
        """
        if not limits:
            return
        now = self._clock()
        buckets = _buckets(limits, agent, server, tool)
        refused = await self._store.take_tokens(buckets, now=now)
        if refused is not None:
            name, rate = limits[refused.index]
            error: RateLimited = rate_limited(tool, name, rate, refused.retry_after_s)
            error.data["policy_version"] = policy_version
            raise error
        if self._pruned_at is None or (now - self._pruned_at).total_seconds() >= _PRUNE_EVERY_S:
            self._pruned_at = now
            with contextlib.suppress(StoreError):  # housekeeping: the call already has its tokens
                await self._store.prune_token_buckets(now=now)

    async def refund(self, limits: Sequence[tuple[str, Rate]], agent: str, server: str, tool: str) -> None:
        """Give back the tokens :meth:`take` took for a call refused before its send (issue #12).

        Best effort and shielded: a refund that the store cannot make only refuses more.
        """
        if not limits:
            return
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(_REFUND_BOUND_S),
            contextlib.suppress(StoreError),
        ):
            await self._store.refund_tokens(_buckets(limits, agent, server, tool), now=self._clock())


def _buckets(limits: Sequence[tuple[str, Rate]], agent: str, server: str, tool: str) -> list[BucketTake]:
    return [
        BucketTake(bucket_key(name, rate, agent, server, tool), rate.tokens, rate.period_s)
        for name, rate in limits
    ]
