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
from dataclasses import dataclass
from datetime import datetime

import anyio

from bastion.errors import Conflict, StaleEpoch, StoreError
from bastion.ids import Epoch, WorkerId
from bastion.store.base import Store
from bastion.store.dsn import redact_argv
from bastion.workers.identity import mint_worker_id
from bastion.workers.liveness import pid_alive, this_host
from bastion.workers.takeover import withdraw_if_dead

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

    async def join(self, *, config_version: str) -> bool:
        """Register and claim the generation; returns whether a predecessor was taken over.

        Raises:
            StoreError: the slot stayed held by a live worker past its lease, or storage failed.
        """
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
                    },
                    now=self.clock(),
                )
            except Conflict:
                continue  # never adopt an identity that exists: mint another
            self.worker = candidate
            break
        else:
            raise StoreError("could not register a fresh worker identity")
        previous = await self.store.get_generation(self.generation)
        # A holder whose PID is known dead on this host is superseded at once, not after its lease (#5).
        await withdraw_if_dead(
            self.store, self.generation, this_host=this_host(), pid_alive=pid_alive, now=self.clock()
        )
        with anyio.fail_after(self.lease_s + 5):
            while True:
                try:
                    self.epoch = await self.store.claim_generation(
                        self.generation, self.worker, now=self.clock(), lease_s=self.lease_s
                    )
                    break
                except Conflict:
                    logger.warning(
                        "generation held by a live worker; waiting for its lease",
                        extra={
                            "generation": self.generation,
                        },
                    )
                    await anyio.sleep(min(1.0, self.lease_s / 4))
        return previous is not None

    async def heartbeat_forever(self) -> None:
        """Keep the claim fresh; a superseded worker learns it here and stops heartbeating."""
        assert self.worker is not None
        while True:
            await anyio.sleep(self.heartbeat_s)
            try:
                await self.store.heartbeat(self.worker, self.clock())
            except StaleEpoch:
                self.superseded = True
                logger.error("this worker was superseded; it stops serving", extra={"worker": self.worker})
                return
            except StoreError as exc:
                logger.warning("heartbeat failed: %s", exc.message)

    def credentials(self) -> tuple[WorkerId, Epoch]:
        assert self.worker is not None and self.epoch is not None
        return self.worker, self.epoch
