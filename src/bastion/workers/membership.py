"""This gateway process as a worker: registered identity, claimed generation, heartbeat (DESIGN section 6).

At start the process registers a fresh identity and claims its generation
(its slot in the deployment, ``gateway.generation``). If the slot's holder is
still live (its heartbeat younger than the lease), the claim is retried until
that lease runs out, and start-up fails if it never does: two live gateways
never share a slot. A takeover returns a higher epoch, and the predecessor's
executions are then recovered (``workers/recovery.py``). Every write the
gateway makes carries ``(worker, epoch)``; the heartbeat runs off the call path.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import anyio

from bastion.errors import Conflict, GenerationHeld, StaleEpoch, StoreError
from bastion.ids import Epoch, WorkerId
from bastion.store.base import Store
from bastion.store.dsn import redact_argv
from bastion.store.failure_log import FailureLog
from bastion.workers.identity import mint_worker_id
from bastion.workers.liveness import pid_alive, this_host
from bastion.workers.withdrawal import withdraw_if_dead

__all__ = ["WorkerMembership"]

logger = logging.getLogger(__name__)


@dataclass
class WorkerMembership:
    """The fencing credentials of this process: who it is, which slot, at which epoch."""

    store: Store
    generation: str
    lease_s: float
    heartbeat_s: float
    clock: Callable[[], datetime]
    worker: WorkerId | None = None
    epoch: Epoch | None = None
    superseded: bool = False
    # Set once when this worker learns it was superseded; `bastion serve` then stops and exits.
    superseded_event: anyio.Event = field(default_factory=anyio.Event)

    def mark_superseded(self, how: str) -> None:
        """This worker lost its generation to a newer epoch: it stops serving, and its process exits."""
        if not self.superseded:
            logger.error(
                "this worker was superseded by a newer epoch; it stops serving and exits",
                extra={"worker": self.worker, "generation": self.generation, "epoch": self.epoch, "how": how},
            )
        self.superseded = True
        self.superseded_event.set()

    async def join(self, *, config_version: str) -> bool:
        """Register and claim the generation; returns whether a predecessor was taken over.

        The slot is waited for *before* an identity is registered, so a refused
        start leaves no worker row without a generation behind (issue #11).

        Raises:
            GenerationHeld: the slot stayed held by a live worker past this worker's lease.
            StoreError: storage failed.
        """
        previous = await self.store.get_generation(self.generation)
        # A holder whose PID is known dead on this host is superseded at once, not after its lease (#5).
        await withdraw_if_dead(
            self.store, self.generation, this_host=this_host(), pid_alive=pid_alive, now=self.clock()
        )
        try:
            with anyio.fail_after(self.lease_s + 5):
                while True:
                    await self._until_slot_free()
                    if self.worker is None:
                        self.worker = await self._register(config_version)
                    try:
                        self.epoch = await self.store.claim_generation(
                            self.generation, self.worker, now=self.clock(), lease_s=self.lease_s
                        )
                        break
                    except Conflict:
                        await anyio.sleep(min(1.0, self.lease_s / 4))  # a racing claimant won; wait again
        except TimeoutError:
            if self.worker is not None:  # registered, then lost a race for the slot: say so in its record
                await self.store.mark_worker_failed(
                    self.worker, "start refused: generation held by a live worker", self.clock()
                )
            raise GenerationHeld(
                f"generation {self.generation!r} is held by a live worker (waited {self.lease_s + 5:g}s); "
                "give this replica its own --generation, or stop the holder",
                generation=self.generation,
            ) from None
        return previous is not None

    async def _until_slot_free(self) -> None:
        """Return once the generation's holder (if any) is not live by this worker's lease."""
        while True:
            held = await self.store.get_generation(self.generation)
            holder = None if held is None else await self.store.get_worker(held.holder)
            if holder is None or not holder.is_live(self.clock(), self.lease_s):
                return
            logger.warning(
                "generation held by a live worker; waiting for its lease",
                extra={"generation": self.generation},
            )
            await anyio.sleep(min(1.0, self.lease_s / 4))

    async def _register(self, config_version: str) -> WorkerId:
        for _ in range(5):
            candidate = mint_worker_id("gateway")
            try:
                await self.store.register_worker(
                    candidate,
                    "gateway",
                    {
                        "started_by": "bastion serve",
                        "argv": redact_argv(sys.argv[:8]),
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "config_version": config_version,
                        "lease_s": self.lease_s,
                    },
                    now=self.clock(),
                )
            except Conflict:
                continue  # never adopt an identity that exists: mint another
            return candidate
        raise StoreError("could not register a fresh worker identity")

    async def heartbeat_forever(self, on_failure: Callable[[StoreError], None] | None = None) -> None:
        """Keep the claim fresh; a superseded worker learns it here and stops heartbeating.

        ``on_failure`` hears every failed heartbeat (the store health: a heartbeat is a write
        every ``heartbeat_s``, so a store that stopped taking writes shows within that bound).
        """
        assert self.worker is not None
        log = FailureLog(logger, "heartbeat")  # one line per change (#23)
        while True:
            await anyio.sleep(self.heartbeat_s)
            try:
                await self.store.heartbeat(self.worker, self.clock())
            except StaleEpoch:
                self.mark_superseded("heartbeat refused")
                return
            except StoreError as exc:
                if on_failure is not None:
                    on_failure(exc)  # the store health says it (one line), not this loop too
                    logger.debug("heartbeat failed: %s", exc.message)
                else:
                    log.failed(exc)
            else:
                log.worked()

    async def check_current(self) -> None:
        """Raises :class:`StaleEpoch` (and marks this worker superseded) unless it still holds its slot.

        Raises:
            StaleEpoch: a newer epoch (or another worker) holds the generation.
            StoreError: storage failed.
        """
        held = await self.store.get_generation(self.generation)
        if held is None or held.holder != self.worker or held.epoch != self.epoch:
            self.mark_superseded("the generation is held by another worker")
            raise StaleEpoch(generation=self.generation)

    def credentials(self) -> tuple[WorkerId, Epoch]:
        assert self.worker is not None and self.epoch is not None
        return self.worker, self.epoch
