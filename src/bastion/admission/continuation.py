"""Executions that wait for their client's input between requests (DESIGN section 3, issue #8).

A ``tools/call`` answered ``input_required`` has not finished: a sessionless
client answers by sending the same call again with ``inputResponses`` and the
``requestState`` it was given. Under an ``execution_id`` that retry is the
same execution, not a replay: its row stays ``invoking`` between rounds, and
the retry is admitted as its continuation only when it names the same
binding and the very ``requestState`` the last round handed out (or, when
the upstream gave none, carries ``inputResponses``). Anything else meets the
row as it is: in flight, hence refused.

Owns the expected continuations of one gateway replica, bounded
(``MAX_WAITING``, oldest forgotten first: a forgotten one is simply refused
as in flight). Never writes to the store.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from bastion.ids import AgentId

__all__ = ["MAX_WAITING", "Continuation", "InputContinuations"]

MAX_WAITING: Final[int] = 10_000


@dataclass(frozen=True)
class Continuation:
    """What the next round of one execution must present."""

    binding: str
    request_state: str | None


class InputContinuations:
    """Per replica: the executions waiting for their client's answers."""

    def __init__(self, *, capacity: int = MAX_WAITING) -> None:
        self._capacity = capacity
        self._waiting: OrderedDict[tuple[AgentId, str], Continuation] = OrderedDict()

    def expect(self, agent: AgentId, execution_id: str, binding: str, request_state: Any) -> None:
        """Remember that this execution's next round may come, with this ``requestState``."""
        key = (agent, execution_id)
        self._waiting.pop(key, None)
        self._waiting[key] = Continuation(binding, request_state if isinstance(request_state, str) else None)
        while len(self._waiting) > self._capacity:
            self._waiting.popitem(last=False)

    def take(
        self, agent: AgentId, execution_id: str, binding: str, params: dict[str, Any]
    ) -> Continuation | None:
        """The continuation this request is, consumed; ``None`` when it is not one."""
        key = (agent, execution_id)
        waiting = self._waiting.get(key)
        if waiting is None or waiting.binding != binding:
            return None
        if waiting.request_state is not None:
            if params.get("requestState") != waiting.request_state:
                return None
        elif "inputResponses" not in params:
            return None
        del self._waiting[key]
        return waiting
