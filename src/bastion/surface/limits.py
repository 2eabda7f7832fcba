"""Grant rate limits on reads, gets, completions and subscriptions (issue 9; DESIGN section 2 step 4).

A grant's ``rate`` is an obligation on every use of what it covers, resources and
prompts included. The buckets are ``tools/call``'s (per grant, agent and server), keyed
here by the method (``resources/read``, ``prompts/get``, ``completion/complete``,
``resources/subscribe``, ``subscriptions/listen``) where a call keys them by tool: a
bucket per URI would grow without bound under a template. Tokens come from the store
when replicas share it (``policy/shared_limits.py``), else from the gateway's in-memory
limiter, exactly as for a tool call. A refused use spends nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from bastion.errors import RateLimited
from bastion.policy.decide import GrantDecision, RateLimiter
from bastion.policy.shared_limits import StoreRateLimiter

__all__ = ["SurfaceLimits"]


class SurfaceLimits:
    """Takes the rate-limit tokens of one surface decision."""

    def __init__(
        self, limiter: RateLimiter, shared: StoreRateLimiter | None, monotonic: Callable[[], float]
    ) -> None:
        self._limiter = limiter
        self._shared = shared
        self._monotonic = monotonic

    async def take(self, decision: GrantDecision, agent: str, server: str, method: str) -> None:
        """Take one token of every limited grant that allowed ``decision``.

        Raises:
            RateLimited: a bucket is empty (nothing is taken).
        """
        if not decision.limits:
            return
        if self._shared is not None:
            await self._shared.take(
                decision.limits, agent, server, method, policy_version=decision.policy_version
            )
            return
        try:
            self._limiter.take(decision.limits, agent, server, method, self._monotonic())
        except RateLimited as exc:
            exc.data["policy_version"] = decision.policy_version
            raise
