"""Withdraw the liveness of a generation's holder whose PID is known dead here (DESIGN section 6).

The one store write that the liveness shortcut of ``workers/liveness.py``
leads to, shared by every path that is about to claim a generation: a
replica joining (``workers/membership.py``), a survivor taking a generation
over (``workers/takeover.py``) and a launched runtime's slot
(``workers/runtimes.py``).
"""

from __future__ import annotations

import logging
from datetime import datetime

from bastion.store.base import Store, WorkerRecord
from bastion.workers.liveness import PidAlive, pid_known_dead

__all__ = ["withdraw_if_dead"]

logger = logging.getLogger(__name__)


async def withdraw_if_dead(
    store: Store, generation: str, *, this_host: str, pid_alive: PidAlive, now: datetime
) -> WorkerRecord | None:
    """Withdraw the liveness of ``generation``'s holder if its PID is known dead on this host.

    Call it before claiming (``WorkerMembership.join``, a takeover) so that a
    holder known dead is superseded at once instead of after its lease.
    Returns the withdrawn record, or ``None`` when there is no holder, it was
    already withdrawn or failed, or its PID is not known dead here (alive, on
    another host, or not recorded). Raises :class:`StoreError`.
    """
    claimed = await store.get_generation(generation)
    if claimed is None:
        return None
    holder = await store.get_worker(claimed.holder)
    if holder is None or holder.withdrawn_at is not None or holder.failed_at is not None:
        return None
    if not pid_known_dead(holder, pid_alive=pid_alive, this_host=this_host):
        return None
    withdrawn = await store.withdraw_liveness(
        holder.worker_id, now=now, reason=f"pid {holder.provenance.get('pid')} is dead on {this_host}"
    )
    logger.warning(
        "worker liveness withdrawn: its pid is dead",
        extra={"worker": holder.worker_id, "generation": generation},
    )
    return withdrawn
