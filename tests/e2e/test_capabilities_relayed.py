"""Capabilities and extensions relayed as the upstreams declare them (issue 24), compared with direct.

Each upstream kind is asked directly and through Bastion, by the official Python client in both
eras (``legacy``: the session era; ``auto``: sessionless, ``server/discover``). Through Bastion a
client sees Bastion's own ``tools`` and, of the rest, what the upstream declared and the gateway
governs: never ``logging``, ``resources`` or ``prompts`` an upstream does not offer, never an
extension (or ``experimental``) the gateway has not been taught, which is logged. ``tasks`` is
relayed to a session-era client where the upstream lets tool calls become tasks (the 2025-11-25
tasks, ``tasks/relay.py``), never to a sessionless one (the 2026 tasks extension is not relayed yet).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.surface.capabilities import GOVERNED_EXTENSIONS
from tests.e2e.conftest import TOKENS, _stop
from tests.e2e.extensions_upstream import LIST_META
from tests.e2e.third_party.servers import fastmcp_python, npm_server
from tests.e2e.upstream_support import listening_upstream
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

MODES = ["legacy", "auto"]
EXTENSIONS_STDIO = [sys.executable, "-m", "tests.e2e.extensions_upstream"]
NOT_RELAYED = ("tasks", "experimental", "extensions")


@pytest.fixture(scope="module")
def extensions_http() -> Iterator[str]:
    with listening_upstream([*EXTENSIONS_STDIO, "--http"]) as url:
        yield url


def _server(kind: str, http_url: str) -> dict[str, Any]:
    """The server entry of one upstream kind (a third-party one skips when not installed)."""
    if kind == "sdk-http":
        return {"url": http_url}
    if kind == "sdk-http-session":
        return {"url": http_url, "era": "session"}
    if kind == "sdk-stdio":
        return {"command": EXTENSIONS_STDIO[0], "args": EXTENSIONS_STDIO[1:]}
    name, *args = kind.split(":")
    command = npm_server(name, *args)
    return {"command": command[0], "args": command[1:]}


@contextlib.asynccontextmanager
async def _direct(server: dict[str, Any], mode: str) -> AsyncIterator[Client]:
    if "url" in server:
        async with Client(streamable_http_client(server["url"]), mode=mode) as client:
            yield client
        return
    params = StdioServerParameters(command=server["command"], args=server["args"])
    async with Client(stdio_client(params), mode=mode) as client:
        yield client


@contextlib.asynccontextmanager
async def _through(url: str, mode: str, agent: str = "alice") -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS[agent]}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def _gateway(
    tmp_path: Path, servers: dict[str, Any], grants: list[Any] | None = None
) -> AsyncIterator[str]:
    config: dict[str, Any] = {
        "servers": servers,
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    if grants is not None:
        config["grants"] = grants
    snapshot = snapshot_from_mapping(config, source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        yield url


def _declared(client: Client) -> dict[str, Any]:
    return client.server_capabilities.model_dump(exclude_none=True, by_alias=True)


@pytest.mark.parametrize(
    "kind",
    ["sdk-http", "sdk-http-session", "sdk-stdio", "everything:stdio", "memory", "sequential-thinking"],
)
async def test_capabilities_through_bastion_are_what_the_upstream_declares(
    tmp_path: Path, extensions_http: str, kind: str
) -> None:
    """Per client era: the capability keys are direct's (plus Bastion's tools), governed extensions kept."""
    server = _server(kind, extensions_http)
    direct: dict[str, dict[str, Any]] = {}
    with anyio.fail_after(60):
        for mode in MODES:
            async with _direct(server, mode) as client:
                direct[mode] = _declared(client)
        async with _gateway(tmp_path, {"up": server}) as url:
            through = {}
            for mode in MODES:
                async with _through(url, mode) as client:
                    through[mode] = _declared(client)
    # What the gateway learns of this upstream: the face it speaks to (session era for stdio and
    # a pinned era), and the extensions of its 2026 face where it has one.
    face = "legacy" if kind != "sdk-http" else "auto"
    expected_keys = {k for k in direct[face] if k not in NOT_RELAYED} | {"tools"}
    declared_extensions = direct[face].get("extensions") or {}
    if kind == "sdk-http":
        declared_extensions = direct["auto"].get("extensions") or {}
    governed = {name: s for name, s in declared_extensions.items() if name in GOVERNED_EXTENSIONS}
    tasks = direct[face].get("tasks") if face == "legacy" else None
    for mode in MODES:
        relayed_tasks = through[mode].pop("tasks", None)
        assert {k for k in through[mode] if k != "extensions"} == expected_keys, (mode, direct, through)
        assert (through[mode].get("extensions") or {}) == governed, (mode, direct, through)
        assert "experimental" not in through[mode]
        # Tasks: as declared, to the session era only (server-everything's: list, cancel, tool calls).
        assert relayed_tasks == (tasks if mode == "legacy" else None), (mode, direct, relayed_tasks)
    if kind == "everything:stdio":
        assert tasks == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    if kind == "sdk-http":
        # The fixture's 2026 face declares both; the gateway relays the one it governs.
        assert set(direct["auto"]["extensions"]) == {"io.modelcontextprotocol/ui", "com.example/unvetted"}
        assert set(through["legacy"]["extensions"]) == {"io.modelcontextprotocol/ui"}
    if kind in ("memory", "sequential-thinking"):
        assert "logging" not in direct["legacy"] and "logging" not in through["legacy"]


async def test_an_ungoverned_extension_is_logged_once_by_name(
    tmp_path: Path, extensions_http: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The extension the gateway was not taught is named in one log line, however many clients ask."""
    caplog.set_level(logging.WARNING, logger="bastion.surface.capabilities")
    with anyio.fail_after(60):
        async with _gateway(tmp_path, {"up": {"url": extensions_http}}) as url:
            for mode in (*MODES, *MODES):
                async with _through(url, mode):
                    pass
    lines = [r.getMessage() for r in caplog.records if r.name == "bastion.surface.capabilities"]
    assert lines == [
        "upstream up declares com.example/unvetted, an extension the gateway does not govern:"
        " not relayed to clients"
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_an_apps_tool_names_its_ui_resource_as_the_client_reads_it(
    tmp_path: Path, extensions_http: str, mode: str
) -> None:
    """A UI tool's resourceUri is the exposed URI; reading it is decided under resource grants."""
    grants = [
        {"agent": "alice", "servers": ["up"], "tools": ["*"], "resources": ["ui://*"]},
        {"agent": "bob", "servers": ["up"], "tools": ["*"]},
    ]
    with anyio.fail_after(60):
        async with _gateway(tmp_path, {"up": {"url": extensions_http}}, grants) as url:
            async with _through(url, mode) as alice:
                tools = {t.name: t for t in (await alice.list_tools()).tools}
                assert tools["up__clock"].meta is not None
                uri = tools["up__clock"].meta["ui"]["resourceUri"]
                read = await alice.read_resource(uri)
            async with _through(url, mode, agent="bob") as bob:
                with pytest.raises(MCPError):
                    await bob.read_resource(uri)
    assert uri == "bastion://up/ui://clock/app.html"
    assert read.contents[0].mime_type == "text/html;profile=mcp-app"
    assert tools["up__plain"].meta is None


@pytest.mark.parametrize("mode", MODES)
async def test_list_level_meta_is_kept_unless_grants_hid_part_of_the_page(
    tmp_path: Path, extensions_http: str, mode: str
) -> None:
    """resources/list keeps the upstream's own _meta, never protocol keys; items hidden by grants drop it."""
    grants = [
        {"agent": "alice", "servers": ["up"], "tools": ["*"], "resources": ["*"]},
        {"agent": "bob", "servers": ["up"], "tools": ["*"], "resources": ["doc://*"]},
    ]
    with anyio.fail_after(60):
        async with _gateway(tmp_path, {"up": {"url": extensions_http}}, grants) as url:
            async with _through(url, mode) as alice:
                listed = await alice.list_resources()
            async with _through(url, mode, agent="bob") as bob:
                hidden = await bob.list_resources()
    own = {k: v for k, v in LIST_META.items() if not k.startswith("io.modelcontextprotocol/")}
    assert listed.meta is not None
    assert {k: v for k, v in listed.meta.items() if not k.startswith("io.modelcontextprotocol/")} == own
    assert "io.modelcontextprotocol/forged" not in listed.meta
    assert hidden.resources == []
    assert not {k for k in (hidden.meta or {}) if not k.startswith("io.modelcontextprotocol/")}


@pytest.fixture(scope="module")
def fastmcp4_apps() -> Iterator[str]:
    """FastMCP 4 (third-party) over HTTP with an MCP Apps tool; its URL once it answers."""
    python = fastmcp_python(4)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = Path(__file__).parent / "third_party" / "fastmcp4_apps.py"
    process = subprocess.Popen([python, str(script), str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            break
        assert process.poll() is None and time.monotonic() < deadline, "FastMCP 4 did not start"
        time.sleep(0.2)
    yield url
    _stop(process)


async def test_fastmcp4s_apps_extension_and_ui_tool_come_through(tmp_path: Path, fastmcp4_apps: str) -> None:
    """A third-party server's declared ui extension reaches both client eras; its UI resource is readable."""
    server = {"url": fastmcp4_apps}
    with anyio.fail_after(90):
        async with _direct(server, "auto") as client:
            direct = _declared(client)
        async with _gateway(tmp_path, {"fm": server}) as url:
            through = {}
            for mode in MODES:
                async with _through(url, mode) as client:
                    through[mode] = _declared(client)
                    tools = {t.name: t for t in (await client.list_tools()).tools}
                    assert tools["fm__clock"].meta is not None
                    uri = tools["fm__clock"].meta["ui"]["resourceUri"]
                    read = await client.read_resource(uri)
                    assert read.contents[0].mime_type == "text/html;profile=mcp-app"
    assert direct["extensions"] == {"io.modelcontextprotocol/ui": {}}
    for mode in MODES:
        assert through[mode]["extensions"] == direct["extensions"]
        assert {k for k in through[mode] if k != "extensions"} == {k for k in direct if k != "extensions"}
    assert uri == "bastion://fm/ui://clock/app.html"
