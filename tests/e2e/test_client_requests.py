"""Requests an upstream makes of the client during a call reach that client, and only that client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CreateMessageResult, ElicitResult, TextContent

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import RunningGateway, Upstream, gateway_config
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


async def answer_elicitation(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"answer": "forty-two"})


async def answer_sampling(context: Any, params: Any) -> CreateMessageResult:
    return CreateMessageResult(
        role="assistant",
        content=TextContent(type="text", text="a summary"),
        model="test-model",
        stop_reason="endTurn",
    )


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_elicitation_and_sampling_reach_the_caller(
    tmp_path: Path, tools_upstream: Upstream, mode: str, era: str
) -> None:
    """Elicitation and sampling asked by an HTTP upstream (either era) are answered by the calling client.

    A sessionless client is asked by input-required rounds, also when the upstream asks mid-call.
    """
    config = gateway_config(tmp_path, tools_upstream.url, era=era)
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        gateway = RunningGateway(url, app.state.gateway, tmp_path)
        async with gateway.client(
            mode=mode, elicitation_callback=answer_elicitation, sampling_callback=answer_sampling
        ) as client:
            asked = await client.call_tool("tools__ask_user", {"question": "what?"})
            summary = await client.call_tool("tools__summarize", {"text": "long text"})
    assert "forty-two" in asked.content[0].text  # type: ignore[union-attr]
    assert "a summary" in summary.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_stdio_upstream_elicitation_reaches_the_only_caller(
    running_gateway: RunningGateway, mode: str
) -> None:
    """A stdio upstream's elicitation reaches the one client in flight (by rounds if it is sessionless)."""
    async with running_gateway.client(mode=mode, elicitation_callback=answer_elicitation) as client:
        asked = await client.call_tool("notes__ask_user", {"question": "what?"})
    assert "forty-two" in asked.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("namespace", ["notes", "tools"])
async def test_undeclared_capability_is_never_offered(
    running_gateway: RunningGateway, namespace: str
) -> None:
    """A client that did not declare elicitation is never asked: the upstream's request fails instead."""
    async with running_gateway.client() as client:
        try:
            result = await client.call_tool(f"{namespace}__ask_user", {"question": "what?"})
        except MCPError as exc:
            refused = exc.error.code in (-32021, -32601)
        else:
            refused = result.is_error is True
        still = await client.call_tool(f"{namespace}__echo", {"text": "fine"})
    assert refused
    assert still.content[0].text == "fine"  # type: ignore[union-attr]
