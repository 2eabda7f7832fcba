"""``requestState`` values bound to the call they were issued for (DESIGN section 1, issue #22 point 4).

A request answered ``input_required`` carries a ``requestState`` that the client
hands back, with its answers, on the retry of the same request. Whoever made the
value (Bastion's own parked rounds, ``upstream/input_rounds.py``, or a sessionless
upstream answering ``input_required`` itself), the client never sees it: it sees an
opaque, unguessable token that this replica issued for one call: one agent, one
method, one server, one target (tool, prompt or resource at that upstream) and its
binding (``admission/binding.py``). The retry that presents the token for that very
call gets the original value back, once; anything else is refused:

- a token this replica never issued, one already used, expired, or another agent's:
  :class:`~bastion.errors.InputRoundUnknown` (one answer; the audit keeps the cause);
- the caller's own token presented with another call (tool, server, method or
  arguments): :class:`~bastion.errors.InputRoundMismatch`, and the token is spent.

Tokens live at the replica that issued them (as parked rounds do): at another replica
one is unknown, refused typed, and the client calls again without it.

Owns the outstanding tokens of one gateway replica, bounded per agent and overall
(oldest forgotten first) and by age. Never writes to the store; never logs a value.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from bastion.errors import InputRoundMismatch, InputRoundUnknown

__all__ = ["ROUND_PREFIX", "ROUND_TTL_S", "RoundCall", "RoundStates"]

ROUND_TTL_S: Final[float] = 600.0
ROUND_PREFIX: Final[str] = "bastion-round."
MAX_OUTSTANDING: Final[int] = 10_000
MAX_PER_AGENT: Final[int] = 256
_SPENT_REMEMBERED: Final[int] = 10_000  # used tokens remembered (as digests) to name a replay


@dataclass(frozen=True)
class RoundCall:
    """The call a ``requestState`` continues: who, which request, to what, with which binding."""

    agent: str
    method: str
    server: str
    target: str
    binding: str


@dataclass(frozen=True)
class _Issued:
    call: RoundCall
    value: str
    expires_at: float


class RoundStates:
    """Per replica: the ``requestState`` tokens handed out, each bound to its call."""

    def __init__(
        self,
        *,
        ttl_s: float = ROUND_TTL_S,
        capacity: int = MAX_OUTSTANDING,
        per_agent: int = MAX_PER_AGENT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._per_agent = per_agent
        self._monotonic = monotonic
        self._issued: OrderedDict[str, _Issued] = OrderedDict()
        self._by_agent: dict[str, OrderedDict[str, None]] = {}
        self._spent: OrderedDict[str, None] = OrderedDict()

    def wrap(self, call: RoundCall, result: dict[str, Any]) -> dict[str, Any]:
        """``result`` with its ``requestState`` (if a string) replaced by a token bound to ``call``."""
        value = result.get("requestState")
        if not isinstance(value, str):
            return result
        return {**result, "requestState": self.issue(call, value)}

    def issue(self, call: RoundCall, value: str) -> str:
        """A new token for ``value``, good once for ``call``."""
        token = ROUND_PREFIX + secrets.token_urlsafe(24)
        self._issued[token] = _Issued(call, value, self._monotonic() + self._ttl_s)
        mine = self._by_agent.setdefault(call.agent, OrderedDict())
        mine[token] = None
        while len(mine) > self._per_agent:
            self._forget(next(iter(mine)))
        while len(self._issued) > self._capacity:
            self._forget(next(iter(self._issued)))
        return token

    def take(self, call: RoundCall, params: dict[str, Any]) -> str | None:
        """The upstream's value for the ``requestState`` in ``params``, consumed; ``None`` without one.

        Raises:
            InputRoundUnknown: not issued here, used, expired or another agent's (``cause`` says which).
            InputRoundMismatch: the caller's own token, issued for another call (now spent).
        """
        if "requestState" not in params:
            return None
        token = params["requestState"]
        if not isinstance(token, str):
            raise InputRoundUnknown(cause="not_a_string")
        issued = self._issued.get(token)
        if issued is None:
            raise InputRoundUnknown(cause="spent" if _digest(token) in self._spent else "unknown")
        if issued.call.agent != call.agent:
            # Left in place: whoever else holds the value cannot end its owner's round either.
            raise InputRoundUnknown(cause="other_agent")
        self._forget(token)
        self._remember_spent(token)
        if issued.expires_at <= self._monotonic():
            raise InputRoundUnknown(cause="expired")
        if issued.call != call:
            raise InputRoundMismatch(cause=_mismatch(issued.call, call))
        return issued.value

    def _forget(self, token: str) -> None:
        issued = self._issued.pop(token, None)
        if issued is None:
            return
        mine = self._by_agent.get(issued.call.agent)
        if mine is not None:
            mine.pop(token, None)
            if not mine:
                del self._by_agent[issued.call.agent]

    def _remember_spent(self, token: str) -> None:
        self._spent[_digest(token)] = None
        while len(self._spent) > _SPENT_REMEMBERED:
            self._spent.popitem(last=False)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _mismatch(issued: RoundCall, presented: RoundCall) -> str:
    """Which part of the call differs, for the audit (never the values)."""
    if issued.method != presented.method:
        return "other_method"
    if issued.server != presented.server:
        return "other_server"
    if issued.target != presented.target:
        return "other_target"
    return "other_binding"
