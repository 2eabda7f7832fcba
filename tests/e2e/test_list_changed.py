"""An upstream's tools/list_changed reaches the client sessions that see that namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import RunningGateway, Upstream, gateway_config
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


@pytest.fixture
async def shared_gateway(tmp_path: Path, tools_upstream: Upstream) -> AsyncIterator[RunningGateway]:
    """The notes server declared stateless (``scope = "shared"``): one process serves every client."""
    config = gateway_config(tmp_path, tools_upstream.url)
    config["servers"]["notes"]["scope"] = "shared"
    app = create_app(
        snapshot_from_mapping(config, source=None, version="test"), RuntimeOptions(data_dir=tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        yield RunningGateway(url, app.state.gateway, tmp_path)


async def test_upstream_list_changed_reaches_the_client_and_the_surface_grows(
    shared_gateway: RunningGateway,
) -> None:
    """A shared stdio upstream registers a tool at run time: clients are told; the tool is listed and
    callable."""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with (
        shared_gateway.client(message_handler=on_message) as client,
        shared_gateway.client("bob") as bob,
    ):
        before = {t.name for t in (await client.list_tools()).tools}
        assert "notes__fresh" not in before
        await bob.call_tool("notes__grow", {"name": "fresh"})
        with anyio.fail_after(15):
            await changed.wait()
        after = {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool("notes__fresh", {"text": "hi"})
    assert "notes__fresh" in after
    assert result.content[0].text == "fresh: hi"  # type: ignore[union-attr]


async def test_a_tool_one_owner_grows_never_reaches_another(running_gateway: RunningGateway) -> None:
    """With a process per client session (the default), a tool bob's process registers is not in
    alice's surface, and alice cannot call it (issue 22: no upstream state crosses clients)."""
    async with running_gateway.client() as alice, running_gateway.client("bob") as bob:
        await alice.call_tool("notes__echo", {"text": "mine"})
        await bob.call_tool("notes__grow", {"name": "fresh"})
        assert _text(await bob.call_tool("notes__echo", {"text": "bob's"})) == "bob's"
        assert "notes__fresh" not in {t.name for t in (await alice.list_tools()).tools}
        with pytest.raises(MCPError) as unknown:
            await alice.session.call_tool("notes__fresh", {"text": "hi"})
    assert unknown.value.error.data["reason"] == "unknown_tool"


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)
