"""After the durable ``invoking`` mark, every way out ends terminal and audited (DESIGN 2-3, #12).

Once a call may reach the upstream, the only exits are a terminal state and its
audit entry. :func:`send_and_settle` owns that region of ``call.py``: it runs
the send, checks that the result can cross the gateway, and finishes the
attempt exactly once, whatever happened:

- a result: ``completed`` (or ``failed`` when ``isError``), with its digest;
- the upstream's JSON-RPC error: ``failed``;
- a typed upstream error: ``outcome_unknown`` when the upstream may have acted,
  else ``failed``;
- cancellation (client cancel, closed stream, revocation): ``outcome_unknown``,
  written shielded;
- anything else (a result with NaN, a lone surrogate or nesting too deep to
  walk, a reader that broke on garbage, a bug): ``outcome_unknown``, and the
  client gets :class:`~bastion.errors.UpstreamProtocolError` with a reason
  instead of a traceback.

It never decides policy and never renders an answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from bastion.admission.states import ExecutionState
from bastion.audit.entry import digest_json
from bastion.errors import BastionError, UpstreamError, UpstreamProtocolError
from bastion.tasks.support import is_task_result
from bastion.upstream.base import UpstreamReplied
from bastion.wire_value import wire_problem

__all__ = ["Finish", "send_and_settle"]


class Finish(Protocol):
    """Records the attempt's terminal state durably, then its audit entry (``ToolCallPath._finish``)."""

    def __call__(
        self, state: ExecutionState, *, reason: str | None, result_digest: str | None = None
    ) -> Awaitable[None]: ...


async def send_and_settle(
    send: Callable[[], Awaitable[dict[str, Any]]],
    finish: Finish,
    *,
    on_input_required: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    on_task: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Run ``send`` and finish the attempt exactly once; returns the checked result.

    A result of ``resultType`` ``input_required`` is no outcome (the client comes back with the
    same call, issue #8): it goes to ``on_input_required`` instead, and nothing is finished.
    A task the call asked for (``on_task`` given, issue 24) is no outcome either: ``on_task``
    owns it and its answer is returned; the execution ends when the task does (``tasks/relay.py``).
    If ``on_task`` fails, the task runs where nobody can collect it: ``outcome_unknown``.

    Raises:
        UpstreamReplied: the upstream answered with a JSON-RPC error (recorded ``failed``).
        UpstreamError: the upstream failed, or answered what cannot be relayed
            (``UpstreamProtocolError`` with ``problem``).
        StoreError: the terminal state could not be made durable (``NotDurable``).
    """
    try:
        result = await send()
        problem = _result_problem(result, task_asked=on_task is not None)
        if problem is not None:
            raise UpstreamProtocolError(
                "Upstream answered a result the gateway cannot relay", may_have_acted=True, problem=problem
            )
        if on_task is not None and is_task_result(result):
            return await on_task(result)
        digest = digest_json(result)
    except UpstreamReplied:
        await finish(ExecutionState.FAILED, reason="upstream_error")
        raise
    except UpstreamError as exc:
        state = ExecutionState.OUTCOME_UNKNOWN if exc.may_have_acted else ExecutionState.FAILED
        await finish(state, reason=exc.reason.value)
        raise
    except BastionError:
        # A refusal raised after the mark (a store write, a relay) still leaves the row terminal.
        await finish(ExecutionState.OUTCOME_UNKNOWN, reason="outcome_unknown")
        raise
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await finish(ExecutionState.OUTCOME_UNKNOWN, reason="cancelled")
        raise
    except Exception as exc:
        # Whatever broke, the request may have reached the upstream: never leave it "invoking".
        error = UpstreamProtocolError(
            "Upstream answered a message the gateway cannot read",
            may_have_acted=True,
            problem=type(exc).__name__,
        )
        await finish(ExecutionState.OUTCOME_UNKNOWN, reason=error.reason.value)
        raise error from exc
    if on_input_required is not None and result.get("resultType") == "input_required":
        await on_input_required(result)
        return result
    state = ExecutionState.FAILED if result.get("isError") is True else ExecutionState.COMPLETED
    await finish(state, reason=None, result_digest=digest)
    return result


def _result_problem(result: Any, *, task_asked: bool) -> str | None:
    if not isinstance(result, dict):
        return "not_an_object"
    if "_meta" in result and not isinstance(result["_meta"], dict):
        return "meta_not_an_object"
    if is_task_result(result) and not task_asked:
        # A task nobody asked for cannot be owned or collected here (tasks/support.py, issue 24).
        return "unrequested_task"
    return wire_problem(result)
