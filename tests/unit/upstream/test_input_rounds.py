"""Parked input rounds: good once, for their own agent, within their bound (upstream/input_rounds.py)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from bastion.errors import InputRoundUnknown, OutcomeUnknown
from bastion.upstream.input_rounds import InputRound, ParkedRounds

pytestmark = pytest.mark.anyio


async def _ask_once(round_: InputRound) -> dict[str, Any]:
    answer = await round_.request("elicitation/create", {"message": "ok?"})
    return {"content": [{"type": "text", "text": str(answer.get("action"))}]}


async def test_a_question_becomes_an_input_request_and_its_answer_resumes_the_call() -> None:
    """The call's question ends the client request as input_required; the answer finishes the call."""
    parked = ParkedRounds()
    async with anyio.create_task_group() as tg:
        round_ = InputRound("alice")
        tg.start_soon(round_.run, lambda: _ask_once(round_))
        with anyio.fail_after(5):
            asked, asks_client = await round_.next_answer()
        state = parked.park(round_, tg)
        with pytest.raises(InputRoundUnknown):
            parked.resume(state, "bob")
        resumed = parked.resume(state, "alice")
        resumed.answer({key: {"action": "accept"} for key in asked["inputRequests"]})
        with anyio.fail_after(5):
            final, final_asks = await resumed.next_answer()
        with pytest.raises(InputRoundUnknown):
            parked.resume(state, "alice")
    assert asks_client and not final_asks
    assert asked["resultType"] == "input_required"
    assert [r["method"] for r in asked["inputRequests"].values()] == ["elicitation/create"]
    assert final["content"][0]["text"] == "accept"


async def test_a_round_not_resumed_in_time_is_cancelled_upstream() -> None:
    """Past its bound a parked round is forgotten and its upstream call cancelled."""
    parked = ParkedRounds(ttl_s=0.05)
    cancelled = anyio.Event()

    async def call() -> dict[str, Any]:
        try:
            return await _ask_once(round_)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    async with anyio.create_task_group() as tg:
        round_ = InputRound("alice")
        tg.start_soon(round_.run, call)
        with anyio.fail_after(5):
            await round_.next_answer()
        state = parked.park(round_, tg)
        with anyio.fail_after(5):
            await cancelled.wait()
    with pytest.raises(InputRoundUnknown):
        parked.resume(state, "alice")


async def test_a_call_cancelled_while_asking_ends_as_outcome_unknown() -> None:
    """A round whose call was cancelled answers OutcomeUnknown, never a guessed result."""
    async with anyio.create_task_group() as tg:
        round_ = InputRound("alice")
        tg.start_soon(round_.run, lambda: _ask_once(round_))
        with anyio.fail_after(5):
            await round_.next_answer()
        round_.scope.cancel()
        with anyio.fail_after(5), pytest.raises(OutcomeUnknown):
            await round_.next_answer()
