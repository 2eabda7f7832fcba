"""A small stdio MCP server for tests and demos: ``python -m bastion.examples.notes_server``.

Serves both protocol eras over stdio (the SDK's loop picks the era from the
first message): the shared tools of ``common_tools.py`` plus ``add_note``,
``list_notes`` and ``roots``, and the notes as resources and prompts with completion
(``notes_surface.py``). Notes are kept as JSON lines in the file named by
``BASTION_NOTES_FILE``; the counter in the file named by
``BASTION_COUNTER_FILE``. Both default to per-user files in the temp directory.

A stdio server owns stdout for the protocol: nothing here may print.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, ListRoots, MCPServer, Resolve
from mcp_types import ListRootsResult, ToolAnnotations

from bastion.examples.common_tools import READ_ONLY, add_common_tools
from bastion.examples.counter import FileCounter
from bastion.examples.notes_file import NoteFile
from bastion.examples.notes_surface import add_notes_surface

__all__ = ["build_server", "main"]


def _ask_roots() -> ListRoots:
    return ListRoots()


def build_server(notes: NoteFile, counter: FileCounter) -> MCPServer[Any]:
    """The notes server, keeping notes in ``notes`` and the side-effect count in ``counter``."""
    server: MCPServer[Any] = MCPServer("bastion-example-notes", version="0.1.0", log_level="WARNING")
    add_common_tools(server, counter)

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
        structured_output=False,
    )
    def add_note(text: str) -> int:
        """Append a note; return how many notes there are now."""
        return notes.add(text)

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def list_notes() -> str:
        """Every note, one per line, oldest first."""
        return "\n".join(notes.read())

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def roots(listing: Annotated[ListRootsResult, Resolve(_ask_roots)]) -> str:
        """The client's roots (roots/list), one URI per line."""
        return "\n".join(str(root.uri) for root in listing.roots)

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
        structured_output=False,
    )
    async def grow(name: str, ctx: Context) -> str:
        """Register a new echo tool called ``name`` and announce it (``notifications/tools/list_changed``)."""

        def extra(text: str) -> str:
            return f"{name}: {text}"

        server.add_tool(extra, name=name, description=f"Echo, registered at run time as {name}.")
        await ctx.session.send_tool_list_changed()
        return f"registered {name}"

    add_notes_surface(server, notes)
    return server


def main() -> None:
    """Serve on stdin/stdout until the client closes stdin."""
    server = build_server(NoteFile.from_environment(), FileCounter.from_environment())
    server.run("stdio")


if __name__ == "__main__":
    main()
