"""An input round's continuation is admitted only as the same execution with its own requestState."""

from __future__ import annotations

from bastion.admission.continuation import InputContinuations
from bastion.ids import AgentId

ALICE, BOB = AgentId("alice"), AgentId("bob")


def test_only_the_same_agent_binding_and_state_continue_once() -> None:
    """Another agent, binding or state is no continuation; the right one is consumed once."""
    waiting = InputContinuations()
    waiting.expect(ALICE, "e1", "b1", "s1")
    assert waiting.take(BOB, "e1", "b1", {"requestState": "s1"}) is None
    assert waiting.take(ALICE, "e1", "b2", {"requestState": "s1"}) is None
    assert waiting.take(ALICE, "e1", "b1", {"requestState": "other"}) is None
    assert waiting.take(ALICE, "e1", "b1", {"requestState": "s1"}) is not None
    assert waiting.take(ALICE, "e1", "b1", {"requestState": "s1"}) is None


def test_without_a_state_the_retry_must_carry_responses() -> None:
    """When the upstream gave no requestState, only a retry carrying inputResponses continues."""
    waiting = InputContinuations()
    waiting.expect(ALICE, "e1", "b1", None)
    assert waiting.take(ALICE, "e1", "b1", {}) is None
    assert waiting.take(ALICE, "e1", "b1", {"inputResponses": {}}) is not None


def test_the_oldest_waiting_execution_is_forgotten_past_capacity() -> None:
    """Bounded: past capacity the oldest is forgotten (and so refused as in flight later)."""
    waiting = InputContinuations(capacity=2)
    for n in range(3):
        waiting.expect(ALICE, f"e{n}", "b", "s")
    assert waiting.take(ALICE, "e0", "b", {"requestState": "s"}) is None
    assert waiting.take(ALICE, "e2", "b", {"requestState": "s"}) is not None
