"""Unit tests of admission/rounds.py: a requestState token is bound to its call, bounded and aged."""

from __future__ import annotations

import pytest

from bastion.admission.rounds import ROUND_PREFIX, RoundCall, RoundStates
from bastion.errors import InputRoundMismatch, InputRoundUnknown

_CALL = RoundCall("alice", "tools/call", "up", "ask", "b" * 64)


def test_a_token_hides_the_value_and_gives_it_back_once() -> None:
    """The client sees a fresh token, never the upstream's value; the matching call gets it back once."""
    rounds = RoundStates()
    wrapped = rounds.wrap(_CALL, {"resultType": "input_required", "requestState": "upstream-secret"})
    token = wrapped["requestState"]
    assert token.startswith(ROUND_PREFIX) and "upstream-secret" not in token
    assert rounds.take(_CALL, {"requestState": token}) == "upstream-secret"
    with pytest.raises(InputRoundUnknown) as spent:
        rounds.take(_CALL, {"requestState": token})
    assert spent.value.cause == "spent"
    assert rounds.take(_CALL, {}) is None


def test_an_expired_token_is_unknown() -> None:
    """Past its age a token is refused as unknown (cause ``expired``)."""
    now = [0.0]
    rounds = RoundStates(ttl_s=10.0, monotonic=lambda: now[0])
    token = rounds.issue(_CALL, "v")
    now[0] = 11.0
    with pytest.raises(InputRoundUnknown) as expired:
        rounds.take(_CALL, {"requestState": token})
    assert expired.value.cause == "expired"


def test_a_non_string_state_and_another_method_are_refused() -> None:
    """A non-string requestState is unknown; the same token with another method is a mismatch."""
    rounds = RoundStates()
    with pytest.raises(InputRoundUnknown):
        rounds.take(_CALL, {"requestState": 7})
    token = rounds.issue(_CALL, "v")
    other = RoundCall("alice", "prompts/get", "up", "ask", "b" * 64)
    with pytest.raises(InputRoundMismatch) as crossed:
        rounds.take(other, {"requestState": token})
    assert crossed.value.cause == "other_method"


def test_one_agent_cannot_crowd_out_another() -> None:
    """Past its per-agent bound an agent's oldest token is forgotten, never another agent's."""
    rounds = RoundStates(per_agent=2)
    bobs = RoundCall("bob", "tools/call", "up", "ask", "b" * 64)
    bob_token = rounds.issue(bobs, "bob-value")
    first, *_ = [rounds.issue(_CALL, f"v{i}") for i in range(3)]
    with pytest.raises(InputRoundUnknown):
        rounds.take(_CALL, {"requestState": first})
    assert rounds.take(bobs, {"requestState": bob_token}) == "bob-value"
