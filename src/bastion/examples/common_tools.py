"""The tools both example upstreams serve, registered on an ``MCPServer``.

``echo``, ``slow`` (progress), ``increment``/``count`` (a side effect that a
test can count from outside, see ``counter.py``), ``crash`` (the process dies
mid-call), ``ask_user`` (elicitation) and ``summarize`` (sampling).

Elicitation and sampling go through the SDK's ``Resolve`` markers rather than
``ctx.elicit``: the SDK then asks mid-call on a session-era connection and
answers ``InputRequiredResult`` on a 2026-07-28 connection, which has no
server-to-client requests, so one tool body serves both eras.

These are test fixtures for Bastion, not part of the gateway: nothing in
``bastion`` outside ``bastion.examples`` may import them.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, Elicit, ElicitationResult, MCPServer, Resolve, Sample
from mcp_types import CreateMessageResult, SamplingMessage, TextContent, ToolAnnotations
from pydantic import BaseModel

from bastion.examples.counter import FileCounter

__all__ = ["READ_ONLY", "Answer", "add_common_tools"]

READ_ONLY = ToolAnnotations(read_only_hint=True)
_SIDE_EFFECT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)


class Answer(BaseModel):
    """What ``ask_user`` elicits from the client."""

    answer: str


def _ask_question(question: str) -> Elicit[Answer]:
    return Elicit(question, Answer)


def _sample_summary(text: str) -> Sample:
    prompt = TextContent(type="text", text=f"Summarize in one line:\n{text}")
    return Sample([SamplingMessage(role="user", content=prompt)], max_tokens=64)


def add_common_tools(server: MCPServer[Any], counter: FileCounter) -> None:
    """Register the shared tools on ``server``; ``increment``/``count`` use ``counter``."""

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def echo(text: str) -> str:
        """Return ``text`` unchanged."""
        return text

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def slow(seconds: float, steps: int, ctx: Context) -> str:
        """Sleep ``seconds`` in ``steps`` equal parts, reporting progress after each part."""
        parts = max(steps, 1)
        for done in range(1, parts + 1):
            await anyio.sleep(seconds / parts)
            if steps > 0:
                await ctx.report_progress(done, steps, f"step {done} of {steps}")
        return "done"

    @server.tool(annotations=_SIDE_EFFECT, structured_output=False)
    def increment() -> int:
        """Add one to the counter file and return the new count."""
        return counter.increment()

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def count() -> int:
        """Return how many times ``increment`` has run, across restarts."""
        return counter.count()

    @server.tool(annotations=_SIDE_EFFECT, structured_output=False)
    async def crash() -> str:
        """Kill this server process mid-call (exit status 1), for fault tests."""
        os._exit(1)

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def ask_user(
        question: str,
        outcome: Annotated[ElicitationResult[Answer], Resolve(_ask_question)],
    ) -> str:
        """Ask the client's user ``question`` (elicitation); return the answer or the action."""
        if outcome.action == "accept":
            return outcome.data.answer
        return outcome.action

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def summarize(
        text: str,
        summary: Annotated[CreateMessageResult, Resolve(_sample_summary)],
    ) -> str:
        """Ask the client's model to summarize ``text`` (sampling); return its text."""
        content = summary.content
        if isinstance(content, TextContent):
            return content.text
        return f"<{content.type}>"
