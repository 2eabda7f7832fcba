"""The notes server's resources, prompts and completions, registered on an ``MCPServer``.

Everything here reads the same note file the ``add_note`` and ``list_notes`` tools use:

- ``notes://all``, a static resource: every note, one per line, oldest first;
- ``notes://notes/{number}``, a resource template: the note with that number (1 is the
  oldest);
- ``summarize_notes(style)``, a prompt asking to summarize every note in one of ``STYLES``;
- ``recall_note(number)``, a prompt asking about one note;
- a number with no note is ``-32602`` in both;
- completion of ``style`` from ``STYLES`` and of ``number`` (the template's and the
  prompt's) from the numbers of the notes there are, both by prefix.

These are demo fixtures for Bastion, not part of the gateway.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
)

from bastion.examples.notes_file import NoteFile

__all__ = ["ALL_NOTES_URI", "NOTE_TEMPLATE", "STYLES", "add_notes_surface"]

ALL_NOTES_URI = "notes://all"
NOTE_TEMPLATE = "notes://notes/{number}"
STYLES = ("briefly", "as bullet points", "in detail")
_NUMBERED = {("ref/resource", NOTE_TEMPLATE), ("ref/prompt", "recall_note")}


def add_notes_surface(server: MCPServer[Any], notes: NoteFile) -> None:
    """Register the notes resources, prompts and completion handler on ``server``."""

    @server.resource(ALL_NOTES_URI, name="all-notes", mime_type="text/plain")
    def all_notes() -> str:
        """Every note, one per line, oldest first."""
        return "\n".join(notes.read())

    @server.resource(NOTE_TEMPLATE, name="note", mime_type="text/plain")
    def note(number: str) -> str:
        """The note with this number (1 is the oldest)."""
        text = _note(notes, number)
        if text is None:
            raise ResourceNotFoundError(f"there is no note {number}")
        return text

    @server.prompt(description="Ask for a summary of every note, in a given style.")
    def summarize_notes(style: str) -> str:
        listing = "\n".join(f"- {text}" for text in notes.read()) or "(no notes yet)"
        return f"Summarize my notes {style}:\n{listing}"

    @server.prompt(description="Ask what to do next about one note.")
    def recall_note(number: str) -> str:
        text = _note(notes, number)
        if text is None:
            raise MCPError(code=INVALID_PARAMS, message=f"there is no note {number}")
        return f"What should I do next about this note?\n{text}"

    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion | None:
        key = (ref.type, ref.name if isinstance(ref, PromptReference) else ref.uri)
        if key == ("ref/prompt", "summarize_notes") and argument.name == "style":
            candidates = list(STYLES)
        elif key in _NUMBERED and argument.name == "number":
            candidates = [str(n) for n in range(1, len(notes.read()) + 1)]
        else:
            return None
        values = [value for value in candidates if value.startswith(argument.value)]
        return Completion(values=values, total=len(values), has_more=False)

    # The SDK leaves ``completion()`` unannotated; ``complete`` itself is typed.
    server.completion()(complete)  # type: ignore[no-untyped-call]


def _note(notes: NoteFile, number: str) -> str | None:
    """The note numbered ``number`` (1 is the oldest), or ``None`` when there is none."""
    texts = notes.read()
    if not number.isdecimal() or not 1 <= int(number) <= len(texts):
        return None
    return texts[int(number) - 1]
