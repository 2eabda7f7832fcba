"""The official MCP Python client, in both eras, through Bastion to real upstream subprocesses."""

from __future__ import annotations

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import RunningGateway, counter_value

pytestmark = pytest.mark.anyio

MODES = ["legacy", "auto"]


@pytest.mark.parametrize("mode", MODES)
async def test_lists_the_namespaced_union_of_both_upstreams(
    running_gateway: RunningGateway, mode: str
) -> None:
    """tools/list is the union of the stdio and HTTP upstreams, namespaced, annotations preserved."""
    async with running_gateway.client(mode=mode) as client:
        expected_version = "2025-11-25" if mode == "legacy" else "2026-07-28"
        assert client.protocol_version == expected_version
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert {"notes__echo", "notes__add_note", "tools__echo", "tools__hang"} <= set(tools)
    assert all(name.startswith(("notes__", "tools__")) for name in tools)
    assert tools["tools__echo"].annotations is not None
    assert tools["tools__echo"].annotations.read_only_hint is True
    assert tools["notes__increment"].annotations is not None
    assert tools["notes__increment"].annotations.read_only_hint is False
    assert tools["tools__echo"].input_schema["properties"]["text"]["type"] == "string"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("namespace", ["notes", "tools"])
async def test_calls_reach_the_right_upstream(
    running_gateway: RunningGateway, mode: str, namespace: str
) -> None:
    """A call routes by namespace and its result comes back intact."""
    async with running_gateway.client(mode=mode) as client:
        result = await client.call_tool(f"{namespace}__echo", {"text": f"hello {namespace}"})
    assert result.is_error is False
    assert result.content[0].text == f"hello {namespace}"  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("namespace", ["notes", "tools"])
async def test_progress_reaches_the_caller_with_its_own_token(
    running_gateway: RunningGateway, mode: str, namespace: str
) -> None:
    """Progress from the upstream arrives at the calling client, in order, on its own call."""
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with running_gateway.client(mode=mode) as client:
        result = await client.call_tool(
            f"{namespace}__slow", {"seconds": 0.2, "steps": 4}, progress_callback=on_progress
        )
    assert result.content[0].text == "done"  # type: ignore[union-attr]
    assert seen == [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)]


@pytest.mark.parametrize("mode", MODES)
async def test_side_effect_happens_once_per_call(running_gateway: RunningGateway, mode: str) -> None:
    """A mutating tool runs exactly once per call through the gateway."""
    counter = running_gateway.tmp_path / "notes-counter.log"
    before = counter_value(counter)
    async with running_gateway.client(mode=mode) as client:
        for _ in range(3):
            await client.call_tool("notes__increment", {})
    assert counter_value(counter) == before + 3


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_tool_is_a_jsonrpc_error(running_gateway: RunningGateway, mode: str) -> None:
    """Calling a tool that is not in the surface is a typed JSON-RPC error, not a crash."""
    async with running_gateway.client(mode=mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.session.call_tool("tools__nope", {})
    assert caught.value.error.data["reason"] == "unknown_tool"


@pytest.mark.parametrize("mode", MODES)
async def test_tool_error_result_passes_through(running_gateway: RunningGateway, mode: str) -> None:
    """An upstream isError result reaches the client as an isError result."""
    async with running_gateway.client(mode=mode) as client:
        result = await client.call_tool("tools__fail", {})
    assert result.is_error is True


async def test_ping(running_gateway: RunningGateway) -> None:
    """ping answers in the session era (the sessionless era removed it)."""
    async with running_gateway.client(mode="legacy") as client:
        result = await client.session.send_ping()
    assert result is not None


async def test_resources_and_prompts_of_an_upstream_that_has_none_add_nothing(
    running_gateway: RunningGateway,
) -> None:
    """The tools server declares resources and prompts but holds none: only the notes server's are listed."""
    async with running_gateway.client(mode="legacy") as client:
        resources = await client.list_resources()
        prompts = await client.list_prompts()
    assert [r.uri for r in resources.resources] == ["bastion://notes/notes://all"]
    assert {p.name for p in prompts.prompts} == {"notes__summarize_notes", "notes__recall_note"}


@pytest.mark.parametrize("mode", MODES)
async def test_the_demo_s_arguments_complete_through_bastion(
    running_gateway: RunningGateway, mode: str
) -> None:
    """completion/complete reaches the notes server for its template and prompt under their gateway names."""
    template = types.ResourceTemplateReference(
        type="ref/resource", uri="bastion://notes/notes://notes/{number}"
    )
    prompt = types.PromptReference(type="ref/prompt", name="notes__summarize_notes")
    async with running_gateway.client(mode=mode) as client:
        for text in ("first", "second"):
            await client.call_tool("notes__add_note", {"text": text})
        numbers = await client.complete(template, {"name": "number", "value": ""})
        styles = await client.complete(prompt, {"name": "style", "value": "in"})
    assert numbers.completion.values == ["1", "2"]
    assert styles.completion.values == ["in detail"]


@pytest.mark.parametrize("namespace", ["notes", "tools"])
async def test_cancellation_ends_the_call_upstream(running_gateway: RunningGateway, namespace: str) -> None:
    """A client that abandons a slow call frees the gateway's in-flight slot and can keep calling."""
    async with running_gateway.client(mode="legacy") as client:
        with anyio.move_on_after(0.5):
            await client.call_tool(f"{namespace}__slow", {"seconds": 30, "steps": 2})
        with anyio.fail_after(10):
            while any(s.in_flight for s in running_gateway.gateway.registry):
                await anyio.sleep(0.02)
        result = await client.call_tool(f"{namespace}__echo", {"text": "after"})
    assert result.content[0].text == "after"  # type: ignore[union-attr]
