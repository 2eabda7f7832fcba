"""A FastMCP 2.x stdio server whose tools speak once their call has returned (issue 22).

Run by the FastMCP 2 interpreter of ``tests/e2e/third_party/servers.py`` (never imports bastion):
``python fastmcp2_stdio_server.py``. One process per client, as a stdio server is written for:
``roots_later`` asks its client ``roots/list`` after the call returned and keeps the answer
(``last_roots`` reads it), ``tick_later`` sends log messages after the call returned, ``grow``
adds a tool and sends ``tools/list_changed``, and ``grow_prompt`` adds a prompt and sends
``prompts/list_changed``.
"""

from __future__ import annotations

import asyncio

from fastmcp import Context, FastMCP

server = FastMCP("stdio-speaker")
_background: set[asyncio.Task[None]] = set()
_answers: list[str] = []


def _later(work: asyncio.Future[None] | asyncio.Task[None]) -> None:
    _background.add(work)  # type: ignore[arg-type]
    work.add_done_callback(_background.discard)  # type: ignore[arg-type]


@server.tool
async def roots_later(ctx: Context) -> str:
    """Ask this client its roots once this call has returned; ``last_roots`` shows the answer."""
    session = ctx.session

    async def ask() -> None:
        await asyncio.sleep(0.3)
        try:
            result = await session.list_roots()
            _answers.append(",".join(sorted(str(root.uri) for root in result.roots)))
        except Exception as exc:  # the refusal is the answer
            _answers.append(f"refused: {exc}")

    _later(asyncio.create_task(ask()))
    return "asking"


@server.tool
def last_roots() -> str:
    """What the last ``roots_later`` was answered (empty until it was)."""
    return _answers[-1] if _answers else ""


@server.tool
async def tick_later(count: int, ctx: Context) -> str:
    """Send ``count`` log messages to this client once this call has returned."""
    session = ctx.session

    async def ticks() -> None:
        await asyncio.sleep(0.3)
        for n in range(count):
            await session.send_log_message(level="warning", data=f"tick {n}", logger="ticks")
            await asyncio.sleep(0.05)

    _later(asyncio.create_task(ticks()))
    return "scheduled"


@server.tool
async def grow(name: str, ctx: Context) -> str:
    """Add a tool ``name`` and tell this client that the tools changed."""

    def fresh() -> str:
        return f"{name} is here"

    server.tool(fresh, name=name)
    await ctx.send_tool_list_changed()
    return "grown"


@server.tool
async def grow_prompt(name: str, ctx: Context) -> str:
    """Add a prompt ``name`` to this process and tell this client that the prompts changed."""

    def fresh() -> str:
        return f"the prompt {name} of this process"

    server.prompt(fresh, name=name)
    await ctx.send_prompt_list_changed()
    return "grown"


if __name__ == "__main__":
    server.run(transport="stdio", show_banner=False)
