"""Fail closed on storage, and know it without traffic (DESIGN sections 3 and 9; issues #3, #23).

When a transition or an audit append cannot be made durable, the gateway
marks the store degraded: new admissions are refused (``NotDurable``) until a
probe write succeeds, and the writes owed (audit records, and a terminal
state that could not be written, issue #23 point 3) are kept (bounded) and
written once storage returns, so the audit says what happened. Nothing here
ever turns a failure into permission to repeat an effect: an execution whose
terminal write failed stays non-terminal in the store, hence refused, until
this worker writes the outcome it observed.

Health is active (issue #23 point 2): while healthy, :meth:`StoreHealth.watch`
sends one cheap read (``Store.probe``) every ``interval_s``, bounded by
``probe_timeout_s``, so an idle replica turns degraded within
``interval_s + probe_timeout_s`` (:data:`DEGRADED_WITHIN_S`) of an outage; while
degraded, it tries the probe write every ``interval_s``. Each change of state
(degraded, its cause changed, recovered) is one log line with the cause; a
traceback is logged at debug only (issue #23 point 5).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from bastion.errors import NotDurable, StaleEpoch, StoreError

__all__ = ["DEGRADED_WITHIN_S", "PROBE_INTERVAL_S", "PROBE_TIMEOUT_S", "StoreHealth"]

logger = logging.getLogger(__name__)

Deferred = Callable[[], Awaitable[object]]

PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0
DEGRADED_WITHIN_S = PROBE_INTERVAL_S + PROBE_TIMEOUT_S
"""An idle replica's ``/readyz`` turns 503 within this bound of a store outage."""


@dataclass
class StoreHealth:
    """Whether this gateway may admit new work, and the writes owed since storage failed."""

    refuse_when_degraded: bool = True
    max_deferred: int = 10_000
    degraded_reason: str | None = None
    # What is known of why (``BastionError.cause``: "authentication refused by PostgreSQL", ...).
    degraded_cause: str | None = None
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
        """Record a failed durable write (or probe); ``owed`` re-does it once storage is back.

        A stale epoch is not a storage failure (issue #11): the store works, this worker was
        superseded. Nothing degrades, and nothing is owed that its stale epoch could never write.
        """
        if isinstance(exc, StaleEpoch):
            logger.warning("write refused: this worker's fencing epoch is stale (superseded)")
            return
        self._degrade(exc)
        if owed is not None:
            if len(self.deferred) >= self.max_deferred:
                self.dropped += 1
            else:
                self.deferred.append(owed)

    def _degrade(self, exc: StoreError) -> None:
        """One log line per change: degraded, or degraded for another cause."""
        first = not self.degraded
        if first or exc.cause != self.degraded_cause:
            extra = {"reason": exc.reason.value, "cause": exc.cause, "detail": exc.data.get("detail")}
            if first:
                logger.error("store degraded: %s%s", exc.message, _because(exc.cause), extra=extra)
            else:
                logger.warning("store still degraded: %s%s", exc.message, _because(exc.cause), extra=extra)
        self.degraded_reason = exc.message
        self.degraded_cause = exc.cause

    async def recover(self, probe: Callable[[], Awaitable[object]]) -> bool:
        """Probe storage; when it answers, write what is owed and clear the degraded state."""
        if not self.degraded:
            return True
        try:
            await probe()
            while self.deferred:
                try:
                    await self.deferred[0]()
                except StaleEpoch:
                    # Superseded meanwhile: what is owed can never be written under this epoch.
                    logger.warning("an owed write was refused (stale epoch); dropped")
                    self.dropped += 1
                except StoreError:
                    raise
                except Exception:
                    # A record that can never be written must not wedge recovery: log it, drop it.
                    logger.warning("an owed audit record could not be written; dropped")
                    logger.debug("the owed record's failure", exc_info=True)
                    self.dropped += 1
                self.deferred.popleft()
        except StoreError as exc:
            self._degrade(exc)
            return False
        logger.warning("store recovered", extra={"written_late": True, "dropped": self.dropped})
        self.degraded_reason = None
        self.degraded_cause = None
        return True

    async def watch(
        self,
        probe_write: Callable[[], Awaitable[object]],
        probe_read: Callable[[float], Awaitable[object]] | None = None,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        """Forever: while healthy, ``probe_read`` every ``interval_s``; while degraded, recover."""
        while True:
            await anyio.sleep(interval_s)
            try:
                if self.degraded:
                    await self.recover(probe_write)
                elif probe_read is not None:
                    await self._probe(probe_read, probe_timeout_s)
            except Exception:  # the watcher must outlive any one failed probe
                logger.warning("store health probe failed unexpectedly")
                logger.debug("the probe's failure", exc_info=True)

    async def _probe(self, probe_read: Callable[[float], Awaitable[object]], timeout_s: float) -> None:
        try:
            await probe_read(timeout_s)  # the engine bounds it (store/base.py Store.probe)
        except StoreError as exc:
            self.failed(exc)


def _because(cause: str | None) -> str:
    return f" ({cause})" if cause else ""
