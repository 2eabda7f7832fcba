"""Whether a worker record counts as live (DESIGN section 6, seed 004).

Liveness is heartbeat freshness alone, with one local shortcut that only ever
takes liveness away: a worker whose recorded PID is known dead *on this host*
is not live at once, before its lease runs out. The reverse never holds: a PID
that answers cannot make an expired record live (it may be a reused PID, or a
process that stopped heartbeating for a reason of its own). A record whose
liveness was withdrawn, or that failed, is never live again.

This module reads records and asks the operating system about PIDs; it never
writes to the store (``workers/withdrawal.py`` records a withdrawal).
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from bastion.store.base import WorkerRecord

__all__ = ["Liveness", "PidAlive", "is_live", "liveness_of", "pid_alive", "pid_known_dead", "this_host"]

PidAlive = Callable[[int], bool]


class Liveness(enum.StrEnum):
    """Why a record is or is not live, in the order :func:`liveness_of` decides."""

    FAILED = "failed"  # a failure of this identity was recorded
    WITHDRAWN = "withdrawn"  # its PID was recorded dead: liveness withdrawn for good
    PID_DEAD = "pid_dead"  # its PID is dead on this host (not yet recorded)
    EXPIRED = "expired"  # its last heartbeat is as old as the lease, or older
    LIVE = "live"


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists on this host (``os.kill(pid, 0)``).

    ``ProcessLookupError`` means dead; ``PermissionError`` means it exists but
    belongs to someone else, so alive. A non-positive PID is never probed
    (``kill(0)`` and ``kill(-1)`` address process groups) and reads alive:
    unknown is not evidence of death.
    """
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def this_host() -> str:
    """The host name that workers record in their provenance (``host``)."""
    return socket.gethostname()


def recorded_pid(provenance: Mapping[str, Any]) -> int | None:
    """The ``pid`` in a launch provenance, if it is a positive integer."""
    pid = provenance.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        return pid
    return None


def pid_known_dead(record: WorkerRecord, *, pid_alive: PidAlive, this_host: str) -> bool:
    """Whether ``record`` names a PID on ``this_host`` that no longer exists.

    Only a record that names both this host and a PID can be known dead here;
    anything else (another host, no PID, a malformed one) is unknown, never dead.
    """
    if record.provenance.get("host") != this_host:
        return False
    pid = recorded_pid(record.provenance)
    return pid is not None and not pid_alive(pid)


def liveness_of(
    record: WorkerRecord, now: datetime, lease_s: float, *, pid_alive: PidAlive, this_host: str
) -> Liveness:
    """The liveness verdict for ``record`` at ``now`` with a lease of ``lease_s`` seconds."""
    # (1) Recorded facts end liveness for good.
    if record.failed_at is not None:
        return Liveness.FAILED
    if record.withdrawn_at is not None:
        return Liveness.WITHDRAWN
    # (2) A PID known dead here withdraws liveness at once, fresh heartbeat or not.
    if pid_known_dead(record, pid_alive=pid_alive, this_host=this_host):
        return Liveness.PID_DEAD
    # (3) Otherwise heartbeat freshness alone decides; a live PID never extends it.
    if not record.is_live(now, lease_s):
        return Liveness.EXPIRED
    return Liveness.LIVE


def is_live(
    record: WorkerRecord, now: datetime, lease_s: float, *, pid_alive: PidAlive, this_host: str
) -> bool:
    """Whether ``record`` counts as live: see :func:`liveness_of`."""
    return liveness_of(record, now, lease_s, pid_alive=pid_alive, this_host=this_host) is Liveness.LIVE
