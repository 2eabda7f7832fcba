"""The gateway-wide bounds on owned stdio processes (issue 22, DESIGN section 5).

Owns: how many owned processes run at once over every stdio server of one
gateway, and how many may be starting (launch and handshake) at once. A
server's own bound (``servers.NAME.max_processes``) is checked beside it by
``upstream/stdio.py``. At a bound the answer is :class:`UpstreamCapacity`,
never a process of another owner or a shared one.

One budget per gateway (built by the fleet); nothing here is process-global.
"""

from __future__ import annotations

import anyio

from bastion.errors import UpstreamCapacity
from bastion.policy.snapshot import GatewaySettings

__all__ = ["ProcessBudget"]


class ProcessBudget:
    """Owned stdio processes running now, against the gateway's bound, and the spawn gate."""

    def __init__(self, max_processes: int, spawn_concurrency: int) -> None:
        if max_processes < 1 or spawn_concurrency < 1:
            raise ValueError("max_processes and spawn_concurrency must be at least 1")
        self.max_processes = max_processes
        self.running = 0
        # Held by a process from its launch to the end of its handshake (upstream/stdio_process.py).
        self.spawn_gate = anyio.Semaphore(spawn_concurrency)

    @classmethod
    def for_settings(cls, settings: GatewaySettings) -> ProcessBudget:
        return cls(settings.max_stdio_processes, settings.stdio_spawn_concurrency)

    def take(self, server: str, server_running: int, server_limit: int) -> None:
        """Count one more process of ``server``, which runs ``server_running`` now.

        Raises:
            UpstreamCapacity: the server's or the gateway's bound is reached (nothing is counted).
        """
        if server_running >= server_limit:
            raise UpstreamCapacity(
                f"upstream {server} runs its most processes ({server_limit}); none is shared",
                bound="server",
                server=server,
                limit=server_limit,
            )
        if self.running >= self.max_processes:
            raise UpstreamCapacity(
                f"the gateway runs its most stdio processes ({self.max_processes}); none is shared",
                bound="gateway",
                server=server,
                limit=self.max_processes,
            )
        self.running += 1

    def give_back(self) -> None:
        self.running = max(0, self.running - 1)
