"""The execution state machine (DESIGN section 3): every edge allowed, every other one a Conflict."""

from __future__ import annotations

import itertools

import pytest

from bastion.admission.states import TERMINAL_STATES, TRANSITIONS, ExecutionState, check_transition
from bastion.errors import Conflict

S = ExecutionState
# Written out independently of the module, from the DESIGN diagram.
EDGES = {
    (None, S.RESERVED),
    (S.RESERVED, S.INVOKING),
    (S.RESERVED, S.RELEASED),
    (S.RELEASED, S.RESERVED),
    (S.INVOKING, S.COMPLETED),
    (S.INVOKING, S.FAILED),
    (S.INVOKING, S.OUTCOME_UNKNOWN),
}
ALL_PAIRS = list(itertools.product([None, *S], S))


@pytest.mark.parametrize(("current", "target"), sorted(EDGES, key=str))
def test_allowed_transition_passes(current: ExecutionState | None, target: ExecutionState) -> None:
    """Each edge of the diagram is allowed."""
    check_transition(current, target)


@pytest.mark.parametrize(("current", "target"), [p for p in ALL_PAIRS if p not in EDGES], ids=str)
def test_every_other_transition_is_a_conflict(current: ExecutionState | None, target: ExecutionState) -> None:
    """Anything off the diagram raises Conflict naming both states."""
    with pytest.raises(Conflict) as caught:
        check_transition(current, target)
    assert caught.value.data == {
        "from_state": None if current is None else current.value,
        "to_state": target.value,
    }


def test_terminal_states_have_no_way_out() -> None:
    """completed, failed and outcome_unknown are terminal, and nothing leaves them."""
    assert {s for s in S if s.is_terminal} == TERMINAL_STATES == {S.COMPLETED, S.FAILED, S.OUTCOME_UNKNOWN}
    assert all(not TRANSITIONS[s] for s in TERMINAL_STATES)


def test_table_covers_every_state_and_is_read_only() -> None:
    """The table has a row for 'no row yet' and each state, and cannot be edited at run time."""
    assert set(TRANSITIONS) == {None, *S}
    with pytest.raises(TypeError):
        TRANSITIONS[S.COMPLETED] = frozenset({S.RESERVED})  # type: ignore[index]


def test_state_values_are_the_wire_and_audit_names() -> None:
    """The values are stable strings shared with the audit outcome field."""
    assert [s.value for s in S] == [
        "reserved",
        "invoking",
        "released",
        "completed",
        "failed",
        "outcome_unknown",
    ]
