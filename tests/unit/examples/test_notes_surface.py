"""The notes server's resources, prompts and completion, driven over stdio by the official SDK client."""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from bastion.examples.notes_surface import ALL_NOTES_URI, NOTE_TEMPLATE, STYLES
from tests.unit.examples.test_example_servers import CALL_LIMIT_S, MODES, client_for, notes_params

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("mode", MODES)]


def _text(contents: types.ReadResourceResult) -> str:
    [block] = contents.contents
    assert isinstance(block, types.TextResourceContents)
    return block.text


def _prompt_text(result: types.GetPromptResult) -> str:
    [message] = result.messages
    assert message.role == "user" and isinstance(message.content, types.TextContent)
    return message.content.text


async def test_notes_are_resources_with_a_template(tmp_path: Path, mode: str) -> None:
    """notes://all and notes://notes/{number} read the note file; an unknown number is -32602."""
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path), mode) as client:
            listed = (await client.list_resources()).resources
            assert [(r.uri, r.name, r.mime_type) for r in listed] == [
                (ALL_NOTES_URI, "all-notes", "text/plain")
            ]
            templates = (await client.list_resource_templates()).resource_templates
            assert [(t.uri_template, t.name) for t in templates] == [(NOTE_TEMPLATE, "note")]
            for text in ("buy milk", "call Ada"):
                await client.call_tool("add_note", {"text": text})
            assert _text(await client.read_resource(ALL_NOTES_URI)) == "buy milk\ncall Ada"
            assert _text(await client.read_resource("notes://notes/2")) == "call Ada"
            with pytest.raises(MCPError) as missing:
                await client.read_resource("notes://notes/3")
    assert missing.value.error.code == types.INVALID_PARAMS


async def test_notes_prompts_take_their_arguments(tmp_path: Path, mode: str) -> None:
    """summarize_notes embeds every note in the style asked; recall_note one note, or -32602."""
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path), mode) as client:
            prompts = {p.name: p for p in (await client.list_prompts()).prompts}
            assert set(prompts) == {"summarize_notes", "recall_note"}
            arguments = prompts["summarize_notes"].arguments or []
            assert [(a.name, a.required) for a in arguments] == [("style", True)]
            empty = await client.get_prompt("summarize_notes", {"style": "briefly"})
            await client.call_tool("add_note", {"text": "buy milk"})
            summary = await client.get_prompt("summarize_notes", {"style": "in detail"})
            recalled = await client.get_prompt("recall_note", {"number": "1"})
            with pytest.raises(MCPError) as missing:
                await client.get_prompt("recall_note", {"number": "2"})
    assert _prompt_text(empty) == "Summarize my notes briefly:\n(no notes yet)"
    assert _prompt_text(summary) == "Summarize my notes in detail:\n- buy milk"
    assert _prompt_text(recalled) == "What should I do next about this note?\nbuy milk"
    assert missing.value.error.code == types.INVALID_PARAMS


async def test_notes_arguments_complete_by_prefix(tmp_path: Path, mode: str) -> None:
    """style completes from the fixed styles; number (template and prompt) from the notes there are."""
    template = types.ResourceTemplateReference(type="ref/resource", uri=NOTE_TEMPLATE)
    recall = types.PromptReference(type="ref/prompt", name="recall_note")
    summarize = types.PromptReference(type="ref/prompt", name="summarize_notes")
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path), mode) as client:
            for n in range(11):
                await client.call_tool("add_note", {"text": f"note {n}"})
            styles = await client.complete(summarize, {"name": "style", "value": ""})
            as_style = await client.complete(summarize, {"name": "style", "value": "as"})
            numbers = await client.complete(template, {"name": "number", "value": "1"})
            recall_numbers = await client.complete(recall, {"name": "number", "value": "1"})
            other = await client.complete(summarize, {"name": "mood", "value": ""})
    assert styles.completion.values == list(STYLES)
    assert as_style.completion.values == ["as bullet points"]
    assert numbers.completion.values == ["1", "10", "11"] and numbers.completion.total == 3
    assert recall_numbers.completion.values == ["1", "10", "11"]
    assert other.completion.values == []
