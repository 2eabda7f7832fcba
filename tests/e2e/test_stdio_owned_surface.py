"""What a client sees of an owned stdio server is what its own process shows it (issue 22 point 2).

Each session-era client has its own process (``servers.NAME.scope`` ``transport_session``): its
``tools/list`` (before any call as after), its ``prompts/list`` and ``prompts/get``, and its
``resources/list`` come from that process, started at the first list if need be, never from the
gateway-wide catalog's listing process (which declares every capability and holds nobody's state).
Third-party servers nobody on this team wrote: server-everything over stdio (its session-scoped
resources, its prompts), and a FastMCP 2.x stdio fixture that adds a prompt to its own process.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.e2e.test_capability_views_e2e import _gateway
from tests.e2e.test_stdio_owned_channel import _speaker
from tests.e2e.third_party.servers import npm_server

pytestmark = pytest.mark.anyio


def _everything() -> dict[str, Any]:
    command = npm_server("everything", "stdio")
    return {"command": command[0], "args": command[1:], "timeout_s": 30.0}


async def _direct(command: list[str]) -> tuple[set[str], set[str]]:
    """The tools and prompts server-everything shows a client with no capabilities, directly."""
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with Client(params, mode="legacy") as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
    return tools, prompts


async def test_a_first_tools_list_comes_from_the_clients_own_process(tmp_path: Path) -> None:
    """Before any call, a client without roots, sampling or elicitation lists what its own process
    shows it (direct alike, no capability-gated tool), not the catalog listed declaring them all."""
    everything = npm_server("everything", "stdio")
    with anyio.fail_after(90):
        direct_tools, direct_prompts = await _direct(everything)
        async with _gateway(tmp_path, {"e": _everything()}) as gateway, gateway.client("alice") as plain:
            tools = {t.name.removeprefix("e__") for t in (await plain.list_tools()).tools}
            prompts = {p.name.removeprefix("e__") for p in (await plain.list_prompts()).prompts}
            upstream = gateway.gateway.fleet.upstreams["e"]
            owners = set(upstream.owned())  # type: ignore[attr-defined]
    assert "get-roots-list" not in direct_tools
    assert tools == direct_tools
    assert prompts == direct_prompts and prompts
    assert len(owners) == 1  # its own process, started by the first list


async def test_a_session_resource_is_listed_and_read_by_its_creator_alone(tmp_path: Path) -> None:
    """server-everything registers a session-scoped resource on the process that made it: alice lists
    and reads hers; bob's list lacks it and his read of it is answered "not found" by his process."""
    data = "data:text/plain;base64," + base64.b64encode(b"alice's secret").decode()
    with anyio.fail_after(90):
        async with (
            _gateway(tmp_path, {"e": _everything()}) as gateway,
            gateway.client("alice") as alice,
            gateway.client("bob") as bob,
        ):
            await alice.call_tool("e__gzip-file-as-resource", {"name": "alice.gz", "data": data})
            alice_listed = {str(r.uri) for r in (await alice.list_resources()).resources}
            uri = next((u for u in alice_listed if u.endswith("session/alice.gz")), "")
            read = await alice.read_resource(uri)
            bob_listed = {str(r.uri) for r in (await bob.list_resources()).resources}
            with pytest.raises(MCPError) as refused:
                await bob.session.read_resource(uri)  # type: ignore[arg-type]
    assert uri, alice_listed
    assert base64.b64decode(read.contents[0].blob) != b""  # type: ignore[union-attr]
    assert uri not in bob_listed and bob_listed  # bob lists his own process's resources
    assert "not found" in refused.value.error.message  # his process never had it


async def test_a_prompt_added_by_a_process_is_its_owners_alone(tmp_path: Path) -> None:
    """A prompt alice's process adds is listed and served to alice; bob neither lists nor gets it."""
    with anyio.fail_after(60):
        async with (
            _gateway(tmp_path, {"s": _speaker()}) as gateway,
            gateway.client("alice") as alice,
            gateway.client("bob") as bob,
        ):
            assert "s__only_a" not in {p.name for p in (await bob.list_prompts()).prompts}
            assert (await alice.call_tool("s__grow_prompt", {"name": "only_a"})).content
            listed = {p.name for p in (await alice.list_prompts()).prompts}
            got = await alice.get_prompt("s__only_a")
            bob_listed = {p.name for p in (await bob.list_prompts()).prompts}
            with pytest.raises(MCPError) as refused:
                await bob.session.get_prompt("s__only_a")
    assert "s__only_a" in listed
    assert "the prompt only_a of this process" in str(got.messages[0].content)
    assert "s__only_a" not in bob_listed
    assert refused.value.error.data["reason"] == "unknown_prompt"
