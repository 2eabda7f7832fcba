"""Fail closed on storage (DESIGN sections 3 and 9, issue #3 point 8).

When a transition or an audit append cannot be made durable, the gateway
marks the store degraded: new admissions are refused (``NotDurable``) until a
probe write succeeds, and the audit records that could not be written are
kept (bounded) and written once storage returns, so the audit says what
happened. Nothing here ever turns a failure into permission to repeat an
effect: an execution whose terminal write failed stays non-terminal in the
store, hence refused.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from bastion.errors import NotDurable, StaleEpoch, StoreError

__all__ = ["StoreHealth"]

logger = logging.getLogger(__name__)

Deferred = Callable[[], Awaitable[object]]


@dataclass
class StoreHealth:
    """Whether this gateway may admit new work, and the audit writes owed since storage failed."""

    refuse_when_degraded: bool = True
    max_deferred: int = 10_000
    degraded_reason: str | None = None
    deferred: deque[Deferred] = field(default_factory=deque)
    dropped: int = 0

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    def check_admissions(self) -> None:
        """Raises ``NotDurable`` while storage is degraded (and refusal is configured)."""
        if self.degraded and self.refuse_when_degraded:
            raise NotDurable(
                "Storage cannot make writes durable; new admissions are refused until it recovers"
            )

    def failed(self, exc: StoreError, owed: Deferred | None = None) -> None:
        """Record a failed durable write; ``owed`` re-does its audit part once storage is back.

        A stale epoch is not a storage failure (issue #11): the store works, this worker was
        superseded. Nothing degrades, and nothing is owed that its stale epoch could never write.
        """
        if isinstance(exc, StaleEpoch):
            logger.warning("write refused: this worker's fencing epoch is stale (superseded)")
            return
        if not self.degraded:
            logger.error("store degraded: %s", exc.message, extra={"reason": exc.reason.value})
        self.degraded_reason = exc.message
        if owed is not None:
            if len(self.deferred) >= self.max_deferred:
                self.dropped += 1
            else:
                self.deferred.append(owed)

    async def recover(self, probe: Callable[[], Awaitable[object]]) -> bool:
        """Probe storage; when it answers, write what is owed and clear the degraded state."""
        if not self.degraded:
            return True
        try:
            await probe()
            while self.deferred:
                try:
                    await self.deferred[0]()
                except StoreError:
                    raise
                except Exception:
                    # A record that can never be written must not wedge recovery: log it, drop it.
                    logger.exception("an owed audit record could not be written; dropped")
                    self.dropped += 1
                self.deferred.popleft()
        except StoreError as exc:
            self.degraded_reason = exc.message
            return False
        logger.warning("store recovered", extra={"written_late": True, "dropped": self.dropped})
        self.degraded_reason = None
        return True

    async def watch(self, probe: Callable[[], Awaitable[object]], interval_s: float = 1.0) -> None:
        while True:
            await anyio.sleep(interval_s)
            if self.degraded:
                try:
                    await self.recover(probe)
                except Exception:  # the watcher must outlive any one failed probe
                    logger.exception("store recovery probe failed")
