"""After authentication the caps are per agent (issue #22 point 6).

Before a credential, what one address may hold is bounded by ``transport/limits.py``. After
it, requests are counted per agent: how many one agent has in progress at this replica,
response streams and GET streams included (``gateway.max_requests_per_agent``). One agent
past its cap is refused with an HTTP answer it can read (429, a JSON-RPC error naming
``agent_request_limit``) and a log line; every other agent, on the same host or behind the
same proxy, is untouched. The counts live in the front door that owns them, never in module
state.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from bastion.errors import AgentRequestLimit

__all__ = ["AgentRequests"]

logger = logging.getLogger(__name__)


class AgentRequests:
    """Per replica: the requests each agent has in progress."""

    def __init__(self) -> None:
        self._by_agent: dict[str, int] = {}

    def in_progress(self, agent: str) -> int:
        return self._by_agent.get(agent, 0)

    @contextlib.contextmanager
    def hold(self, agent: str, cap: int, *, client: str) -> Iterator[None]:
        """Count one request of ``agent`` while the block runs.

        Raises:
            AgentRequestLimit: ``agent`` already has ``cap`` requests in progress (logged).
        """
        held = self._by_agent.get(agent, 0)
        if held >= cap:
            logger.warning(
                "request refused: agent %s has %d requests in progress (gateway.max_requests_per_agent)",
                agent,
                held,
                extra={"reason": AgentRequestLimit.reason.value, "agent": agent, "client": client},
            )
            raise AgentRequestLimit(limit=cap)
        self._by_agent[agent] = held + 1
        try:
            yield
        finally:
            left = self._by_agent[agent] - 1
            if left:
                self._by_agent[agent] = left
            else:
                del self._by_agent[agent]
