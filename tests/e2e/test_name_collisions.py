"""Exposed tool names are never shadowed (issue 12 point 8; upstream/catalog.py).

Namespaces ``notes`` (the stdio notes server) and ``notes_`` (the HTTP tools server): the
tools server's ``echo`` is ``notes___echo``. When the notes server later registers ``_echo``
(also ``notes___echo``) and announces ``list_changed``, the name stays with the tools server,
the newcomer is left out and reported in ``/readyz``, and calls keep going where they went.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import TextContent

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, RunningGateway, Upstream
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


def _config(tmp_path: Path, tools_url: str) -> dict[str, Any]:
    return {
        "servers": {
            "notes": {
                "command": sys.executable,
                "args": ["-m", "bastion.examples.notes_server"],
                "env": {
                    "BASTION_NOTES_FILE": str(tmp_path / "notes.jsonl"),
                    "BASTION_COUNTER_FILE": str(tmp_path / "notes-counter.log"),
                },
                # The gateway-wide catalog's collisions: one process for all, whose list changes it follows
                # (an owned process's list change is its owner's view alone: test_stdio_owned_channel.py).
                "scope": "shared",
            },
            "tools": {"url": tools_url, "namespace": "notes_"},
        },
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }


async def test_a_list_changed_that_introduces_a_held_name_is_refused_and_reported(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """``notes``+``_echo`` meets ``notes_``+``echo``: the holder keeps the name; /readyz names the refusal."""
    snapshot = snapshot_from_mapping(_config(tmp_path, tools_upstream.url), source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        gateway = RunningGateway(url, app.state.gateway, tmp_path)
        changed = anyio.Event()

        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                changed.set()

        async with gateway.client(message_handler=on_message) as client:
            assert "notes___echo" in {t.name for t in (await client.list_tools()).tools}
            await client.call_tool("notes__grow", {"name": "_echo"})
            with anyio.fail_after(15):
                await changed.wait()  # published after the catalog refresh that met the collision
            _, detail = gateway.gateway.readiness()
            assert detail["tool_collisions"] == [
                {"name": "notes___echo", "holder": "tools", "refused": "notes"}
            ]
            result = await client.call_tool("notes___echo", {"text": "still the tools server"})
    text = result.content[0]
    assert isinstance(text, TextContent) and "still the tools server" in text.text
    assert gateway.gateway.fleet.lookup("notes___echo").server == "tools"  # type: ignore[union-attr]


async def test_names_left_out_stay_reported_when_another_server_refreshes(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A tool left out for its name stays in /readyz when a server whose namespace prefixes it refreshes."""
    config = _config(tmp_path, tools_upstream.url)
    config["servers"]["tools"]["namespace"] = "n"  # a prefix of "notes"
    snapshot = snapshot_from_mapping(config, source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        gateway = RunningGateway(url, app.state.gateway, tmp_path)
        changed = anyio.Event()

        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                changed.set()

        async with gateway.client(message_handler=on_message) as client:
            await client.call_tool("notes__grow", {"name": "bad.name"})
            with anyio.fail_after(15):
                await changed.wait()
        fleet = gateway.gateway.fleet
        assert fleet.skipped_tools == ["notes__bad.name"]
        await fleet.refresh_server("tools")
        assert fleet.skipped_tools == ["notes__bad.name"]
