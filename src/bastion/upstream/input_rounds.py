"""Back-channel requests turned into input-required rounds (DESIGN section 0, issue #8).

A session-era upstream asks its client mid-call (``sampling/createMessage``,
``elicitation/create``, ``roots/list``) over the call's stream and waits for
the answer on the same upstream session. A sessionless (2026-07-28) client
has no back channel: it can only be asked by an ``input_required`` result and
answers by retrying the request with ``inputResponses`` and the
``requestState`` it was given. This module joins the two: the upstream call
keeps running in the background while the client is asked, parked under an
unguessable ``requestState`` bound to the agent that made the call; the
retry finds it, hands over the answers, and the call continues.

The other direction is :func:`ask_mid_call`: an upstream that answers
``input_required`` to a session-era client is served by asking that client
over its back channel and sending the request again with the answers.

Owns: the parked calls of one upstream, their bound (``PARK_TTL_S``) and
their cancellation. A ``requestState`` is good once, for its own agent, at
the replica that issued it; any other is refused with ``InputRoundUnknown``.
Never decides policy; never sees credentials.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from bastion.errors import InputRoundUnknown, OutcomeUnknown, UpstreamProtocolError
from bastion.upstream.base import CallContext, CallRelay, ClientDeclined, UpstreamReplied
from bastion.upstream.capability_sets import required_capability
from bastion.upstream.relay import RequestRelay

__all__ = [
    "PARK_TTL_S",
    "STATE_PREFIX",
    "InputRound",
    "ParkedRounds",
    "ask_mid_call",
    "asks_in_rounds",
    "round_trip",
]

PARK_TTL_S = 120.0
STATE_PREFIX = "bastion-rs."
MAX_ROUNDS = 10
# The requests whose 2026-07-28 result may be ``input_required`` (SEP-2322).
_ROUND_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})


@dataclass(eq=False)
class _Ask:
    """One server-to-client request waiting for the client's answer in a later round."""

    method: str
    params: dict[str, Any]
    answered: anyio.Event = field(default_factory=anyio.Event)
    reply: dict[str, Any] | None = None


class InputRound(CallRelay):
    """One upstream call driven across several sessionless client requests.

    It is the upstream call's relay: notifications go to whichever client
    request is current; a server-to-client request becomes an input request
    of the next ``input_required`` answer.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.client: CallRelay | None = None
        self.wire = RequestRelay(self, None)  # replaced by the caller with the call's own token mapping
        self.scope = anyio.CancelScope()
        self._asks: dict[str, _Ask] = {}
        self._keys = iter(range(1, 1_000_000))
        events: tuple[MemoryObjectSendStream[str], MemoryObjectReceiveStream[str]]
        events = anyio.create_memory_object_stream[str](100)
        self._send, self._receive = events
        self._outcome: dict[str, Any] | BaseException | None = None

    # ---------------------------------------------------------------- upstream side

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        if self.client is not None:
            await self.client.notify(method, params)

    async def pause(self, retry_ms: int | None) -> None:
        """Nothing to mirror: a sessionless client's request has no stream to resume."""

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if required_capability(method) is None:
            raise ClientDeclined(
                {"code": -32601, "message": f"{method} cannot be asked of a sessionless client"}
            )
        key = f"r{next(self._keys)}"
        ask = _Ask(method, params)
        self._asks[key] = ask
        await self._send.send(key)
        await ask.answered.wait()
        reply = ask.reply or {}
        if isinstance(reply.get("error"), dict):
            raise ClientDeclined(reply["error"])
        return reply

    async def run(self, call: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """Run the upstream call to its end; its result or error becomes the round's outcome."""
        try:
            with self.scope:
                self._outcome = await call()
            if self.scope.cancelled_caught:
                self._outcome = OutcomeUnknown("the call was cancelled while the client was being asked")
        except Exception as exc:  # handed to the client request waiting on it
            self._outcome = exc
        finally:
            self._send.close()

    # ---------------------------------------------------------------- client side

    def answer(self, responses: Any) -> None:
        """Hand the client's ``inputResponses`` to the questions they answer; unknown keys are ignored."""
        if not isinstance(responses, dict):
            return
        for key, response in responses.items():
            ask = self._asks.get(key)
            if ask is None or ask.answered.is_set():
                continue
            ask.reply = response if isinstance(response, dict) else {}
            ask.answered.set()

    async def next_answer(self) -> tuple[dict[str, Any], bool]:
        """The call's result (with ``False``), or its next question as ``input_required`` (``True``).

        Raises whatever the upstream call raised.
        """
        async for _ in self._receive:
            return self._input_required(), True
        self._receive.close()
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is None:
            raise OutcomeUnknown("the upstream call ended without an outcome")
        return outcome, False

    def abandon(self) -> None:
        """End the upstream call and this round (the client went away or never came back)."""
        self.scope.cancel()
        self._receive.close()

    def _input_required(self) -> dict[str, Any]:
        # Every question still open goes out, so one round can carry several.
        while True:
            try:
                self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        open_asks = {
            key: {"method": ask.method, "params": ask.params}
            for key, ask in self._asks.items()
            if not ask.answered.is_set()
        }
        return {"resultType": "input_required", "inputRequests": open_asks}


class ParkedRounds:
    """The rounds of one upstream waiting for their client's next request, by ``requestState``."""

    def __init__(self, *, ttl_s: float = PARK_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._by_state: dict[str, tuple[InputRound, anyio.CancelScope]] = {}

    def park(self, round_: InputRound, task_group: anyio.abc.TaskGroup) -> str:
        """Park ``round_`` and return its ``requestState``; it is cancelled if not resumed in time."""
        state = STATE_PREFIX + secrets.token_urlsafe(24)
        expiry = anyio.CancelScope()
        self._by_state[state] = (round_, expiry)
        task_group.start_soon(self._expire, state, expiry)
        return state

    def resume(self, state: str, owner: str) -> InputRound:
        """The round parked under ``state`` for ``owner``; good once.

        Raises:
            InputRoundUnknown: unknown, expired, already resumed, or another agent's.
        """
        parked = self._by_state.get(state)
        if parked is None or parked[0].owner != owner:
            raise InputRoundUnknown()
        del self._by_state[state]
        parked[1].cancel()
        return parked[0]

    async def _expire(self, state: str, expiry: anyio.CancelScope) -> None:
        with expiry:
            await anyio.sleep(self._ttl_s)
            parked = self._by_state.pop(state, None)
            if parked is not None:
                parked[0].abandon()

    def cancel_all(self) -> None:
        for round_, expiry in self._by_state.values():
            round_.abandon()
            expiry.cancel()
        self._by_state.clear()


def asks_in_rounds(method: str, ctx: CallContext) -> bool:
    """True for a sessionless client's request on a path whose upstream may ask mid-call.

    Only requests whose result may be ``input_required`` on the client's wire: ``tools/call``,
    ``prompts/get`` and ``resources/read``.
    """
    return ctx.upstream_sessions is None and ctx.relay is not None and method in _ROUND_METHODS


async def round_trip(
    parked: ParkedRounds,
    task_group: anyio.abc.TaskGroup,
    params: dict[str, Any],
    relay: RequestRelay,
    ctx: CallContext,
    send: Callable[[dict[str, Any], RequestRelay], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """A sessionless client on a session-era path: back-channel requests become input-required rounds.

    The upstream call (``send``) runs on in ``task_group``; each question it asks ends this
    client request with ``input_required`` and a ``requestState`` naming the parked call, and
    the client's retry hands the answers over and waits for what comes next.

    Raises:
        InputRoundUnknown: the retry names a round this replica does not hold for this agent.
    """
    owner = ctx.owner or ""
    state = params.get("requestState")
    if isinstance(state, str) and state.startswith(STATE_PREFIX):
        round_ = parked.resume(state, owner)
        round_.answer(params.get("inputResponses"))
    else:
        round_ = InputRound(owner)
        round_.wire = RequestRelay.for_call(ctx, round_)
        wire = round_.wire
        task_group.start_soon(round_.run, lambda: send(params, wire))
    round_.client = ctx.relay
    round_.wire.client_token = relay.client_token
    try:
        answer, asks_client = await round_.next_answer()
    except BaseException:
        round_.abandon()
        raise
    if asks_client:
        answer["requestState"] = parked.park(round_, task_group)
    return answer


async def ask_mid_call(
    send: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
    params: dict[str, Any],
    relay: RequestRelay,
    ctx: CallContext,
) -> dict[str, Any]:
    """Send once; for a session-era client, serve ``input_required`` rounds by asking it mid-call.

    The other direction of :func:`round_trip`: either era of upstream may answer
    ``input_required`` (a 2026 tool, or a session-era server written that way); a
    session-era client is asked over its back channel and the request is sent again
    with the answers. A sessionless client gets the result as it is.

    Raises:
        UpstreamReplied: the client declined a question (its error, relayed).
        UpstreamProtocolError: malformed input requests, or more than ``MAX_ROUNDS`` rounds.
    """
    for _ in range(MAX_ROUNDS):
        result = await send(params)
        if result.get("resultType") != "input_required" or not ctx.client_answers_requests:
            return result
        requests = result.get("inputRequests") or {}
        if not isinstance(requests, dict):
            raise UpstreamProtocolError("upstream sent malformed inputRequests")
        responses: dict[str, Any] = {}
        for key, request in requests.items():
            if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                raise UpstreamProtocolError("upstream sent a malformed input request")
            try:
                responses[key] = await relay.on_request(request["method"], request.get("params") or {})
            except ClientDeclined as exc:
                raise UpstreamReplied(exc.error) from exc
        params = {**params, "inputResponses": responses}
        if "requestState" in result:
            params["requestState"] = result["requestState"]
        else:
            params.pop("requestState", None)
    raise UpstreamProtocolError("upstream kept asking for input")
