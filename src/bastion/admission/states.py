"""The execution state machine (DESIGN section 3, seed 000).

One authoritative row per ``(agent, execution_id)`` moves through these states,
and only along the edges of :data:`TRANSITIONS`::

              reserve (atomic, with binding)
    (none) ───────────────────────────────▶ reserved
    reserved ── definite failure before anything was sent ──▶ released
    released ── re-admitted, same binding only ──▶ reserved
    reserved ── durable mark, then send ──▶ invoking
    invoking ──▶ completed | failed | outcome_unknown      (terminal)

Terminal states have no way out: a terminal row refuses every later request
with the same key as a replay, ``outcome_unknown`` included. This module is a
pure leaf (an enum and a table); every store engine checks its writes against
it, so it must never import the store, the network or the clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from bastion.errors import Conflict

__all__ = ["TERMINAL_STATES", "TRANSITIONS", "ExecutionState", "check_transition"]


class ExecutionState(enum.StrEnum):
    RESERVED = "reserved"
    INVOKING = "invoking"
    RELEASED = "released"
    COMPLETED = "completed"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"

    @property
    def is_terminal(self) -> bool:
        """Whether no transition leaves this state (a later request is a replay)."""
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[ExecutionState] = frozenset(
    {ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.OUTCOME_UNKNOWN}
)

# ``None`` is "no row yet". Anything not listed here is illegal.
TRANSITIONS: Mapping[ExecutionState | None, frozenset[ExecutionState]] = MappingProxyType(
    {
        None: frozenset({ExecutionState.RESERVED}),
        ExecutionState.RESERVED: frozenset({ExecutionState.INVOKING, ExecutionState.RELEASED}),
        ExecutionState.RELEASED: frozenset({ExecutionState.RESERVED}),
        ExecutionState.INVOKING: TERMINAL_STATES,
        ExecutionState.COMPLETED: frozenset(),
        ExecutionState.FAILED: frozenset(),
        ExecutionState.OUTCOME_UNKNOWN: frozenset(),
    }
)


def check_transition(current: ExecutionState | None, target: ExecutionState) -> None:
    """Return if ``current -> target`` is an edge of the table; raise :class:`Conflict` otherwise.

    ``current`` is ``None`` when no row exists yet. The error's data names both
    states so the refusal can be audited.
    """
    if target not in TRANSITIONS[current]:
        raise Conflict(
            "illegal execution state transition",
            from_state=None if current is None else current.value,
            to_state=target.value,
        )
