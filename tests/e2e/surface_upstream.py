"""An upstream with resources, a template, prompts and completion, over stdio or HTTP (issue 9 tests).

Two of them behind one gateway collide on purpose: the same URIs (``doc://readme``,
``doc://pages/{page}``) and the same prompt names (``greet``). ``resources/list`` is
paginated two resources a page, so a gateway page ends where this upstream's does.
``--label`` goes into every text, so a test sees which upstream answered. The tool
``grow_prompt`` adds a prompt and announces ``prompts/list_changed``. Resources can be
subscribed (``resources/subscribe`` per upstream session; ``subscriptions/listen`` at
2026-07-28); the tool ``touch`` changes ``doc://pages/<page>`` and tells exactly the
sessions and listen streams subscribed to it, as a real server would.

    python -m tests.e2e.surface_upstream --label a            # stdio
    python -m tests.e2e.surface_upstream --label b --http     # prints LISTENING <url>
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import (
    Completion,
    EmptyResult,
    ListResourcesResult,
    PaginatedRequestParams,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)

from bastion.examples.tools_server import MCP_PATH, serve_announced

_PAGE = 2


def build_server(label: str) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(f"surface-{label}", log_level="WARNING")
    edits: dict[str, int] = {}
    subscribed: dict[str, list[Any]] = {}  # URI -> the upstream sessions subscribed to it

    @server.resource("doc://readme", name="readme", mime_type="text/plain")
    def readme() -> str:
        return f"readme of {label}"

    @server.resource("doc://secret", name="secret", mime_type="text/plain")
    def secret() -> str:
        return f"secret of {label}"

    @server.resource("doc://notes/1", name="note-1", mime_type="text/plain")
    def note() -> str:
        return f"note of {label}"

    @server.resource("doc://pages/{page}", name="page", mime_type="text/plain")
    def page(page: str) -> str:
        edited = f", edit {edits[page]}" if page in edits else ""
        return f"page {page} of {label}{edited}"

    @server.prompt(description="Greets someone.")
    def greet(name: str) -> str:
        return f"hello {name} from {label}"

    @server.prompt(description="Hidden by grants in the tests.")
    def internal() -> str:
        return f"internal of {label}"

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion:
        values = [w for w in (f"{label}-alpha", f"{label}-beta") if w.startswith(argument.value)]
        return Completion(values=values, total=len(values), has_more=False)

    @server.tool(description="Adds a prompt at run time and announces prompts/list_changed.")
    async def grow_prompt(name: str, ctx: Context) -> str:
        server.prompt(name=name)(lambda: f"{name} of {label}")
        await ctx.session.send_prompt_list_changed()  # session era
        await ctx.notify_prompts_changed()  # 2026: its subscriptions/listen streams
        return f"added {name}"

    @server.tool(description="Changes doc://pages/<page> and tells its subscribers.")
    async def touch(page: str, ctx: Context) -> str:
        edits[page] = edits.get(page, 0) + 1
        uri = f"doc://pages/{page}"
        for session in list(subscribed.get(uri, [])):
            await session.send_resource_updated(uri)  # session era: each subscribed session
        await ctx.notify_resource_updated(uri)  # 2026: the listen streams that named it
        return f"touched {uri}"

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        sessions = subscribed.setdefault(str(params.uri), [])
        if all(_connection(session) is not _connection(ctx.session) for session in sessions):
            sessions.append(ctx.session)
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        sessions = subscribed.get(str(params.uri), [])
        sessions[:] = [s for s in sessions if _connection(s) is not _connection(ctx.session)]
        return EmptyResult()

    @server.tool(description="How many upstream sessions are subscribed to doc://pages/<page>.")
    def subscribers(page: str) -> int:
        return len(subscribed.get(f"doc://pages/{page}", []))

    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)

    async def list_paged(ctx: Any, params: PaginatedRequestParams | None) -> ListResourcesResult:
        everything = await server.list_resources()
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + _PAGE
        return ListResourcesResult(
            resources=everything[start:end], next_cursor=str(end) if end < len(everything) else None
        )

    lowlevel.add_request_handler("resources/list", PaginatedRequestParams, list_paged)
    return server


def _connection(session: Any) -> Any:
    # A request's session object is made per request; the connection under it is the upstream session.
    return getattr(session, "_connection", session)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.surface_upstream")
    parser.add_argument("--label", required=True)
    parser.add_argument("--http", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    server = build_server(args.label)
    if not args.http:
        server.run("stdio")
        return
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host="127.0.0.1")
    anyio.run(lambda: serve_announced(app, host="127.0.0.1", port=0))


if __name__ == "__main__":
    main()
