"""What one stdio server's processes did since the gateway started, for ``/metrics`` (issue #25).

One :class:`ProcessCounts` per configured stdio server (``upstream/stdio.py``
holds it; every process of that server, the listing one and each owner's,
counts into it). Only counts: never an owner, a PID or a command line, so a
label can carry no more than the server's name and its scope.
``gateway_metrics.py`` reads them when scraped.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["ProcessCounts"]


class ProcessCounts:
    """Spawns, failed starts, crashes, restarts and reconnects of one stdio server's processes,
    and its refusals at a process bound (by bound: ``server`` or ``gateway``)."""

    __slots__ = ("capacity_refusals", "crashes", "reconnects", "restarts", "spawn_failures", "spawns")

    def __init__(self) -> None:
        #: OS processes launched (a restart launches one more).
        self.spawns = 0
        #: Attempts that never became ready: the launch or the handshake failed.
        self.spawn_failures = 0
        #: Processes that ended on their own after being ready (never a stop Bastion asked for).
        self.crashes = 0
        #: Attempts to start a process again after it ended or failed to start.
        self.restarts = 0
        #: Processes ready again after a crash or a failed start: the stdio form of a reconnect.
        self.reconnects = 0
        self.capacity_refusals: Counter[str] = Counter()
