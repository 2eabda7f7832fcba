"""An upstream's tools/list_changed reaches the client sessions that see that namespace."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.e2e.conftest import RunningGateway

pytestmark = pytest.mark.anyio


async def test_upstream_list_changed_reaches_the_client_and_the_surface_grows(
    running_gateway: RunningGateway,
) -> None:
    """A stdio upstream registers a tool at run time: clients are told; the tool is listed and callable."""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with (
        running_gateway.client(message_handler=on_message) as client,
        running_gateway.client("bob") as bob,
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
