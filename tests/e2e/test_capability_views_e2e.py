"""What a client sees of an HTTP upstream, and what that upstream sends outside a request (issue 22).

Real processes: the npm package ``@modelcontextprotocol/server-everything`` in Streamable HTTP
mode (it registers ``get-roots-list``, ``trigger-sampling-request``, the elicitation triggers
only for a client that declared what they need), and a FastMCP 2.x server (``mcp`` 1.x, whose
tools ask ``roots/list``, log and announce tools on the session's standalone GET stream:
``third_party/fastmcp2_session_server.py``), behind a real gateway on a loopback socket, with
the official ``mcp`` 2.x client in both eras, directly and through Bastion, two agents at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CreateMessageResult, ElicitResult, ListRootsResult, Root, TextContent

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.upstream.streamable_http import HttpUpstream
from tests.e2e.conftest import TOKENS, RunningGateway
from tests.e2e.third_party.servers import fastmcp_python, npm_server
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

FASTMCP2_SERVER = Path(__file__).parent / "third_party" / "fastmcp2_session_server.py"
# The tools server-everything registers only for a client that declared roots, sampling, elicitation.
GATED = {
    "get-roots-list",
    "trigger-sampling-request",
    "trigger-elicitation-request",
    "trigger-url-elicitation",
}
FULL = "roots+sampling+elicitation"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _http_server(command: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run an HTTP MCP server until it accepts connections on ``port``; its ``/mcp`` URL."""
    process = subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"{command[0]} exited with {process.returncode}"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            assert time.monotonic() < deadline, f"{command} did not listen on {port}"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture
def everything_url() -> Iterator[str]:
    command = npm_server("everything", "streamableHttp")
    port = _free_port()
    with _http_server(command, port, {"PORT": str(port)}) as url:
        yield url


@pytest.fixture
def fastmcp2_url() -> Iterator[str]:
    python = fastmcp_python(2)
    port = _free_port()
    with _http_server([python, "-W", "ignore", str(FASTMCP2_SERVER), str(port)], port) as url:
        yield url


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, servers: dict[str, Any]) -> AsyncIterator[RunningGateway]:
    snapshot = snapshot_from_mapping(
        {
            "gateway": {"upstream_timeout_s": 20.0},
            "servers": servers,
            "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
        },
        source=None,
        version="test",
    )
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        yield RunningGateway(url, app.state.gateway, tmp_path)


@contextlib.asynccontextmanager
async def _direct(url: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", **kwargs) as client,
    ):
        yield client


def _roots(*uris: str) -> Any:
    async def list_roots(context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=uri, name=uri.rsplit("/", 1)[-1]) for uri in uris])  # type: ignore[arg-type]

    return list_roots


async def _sample(context: Any, params: Any) -> CreateMessageResult:
    return CreateMessageResult(
        role="assistant", content=TextContent(type="text", text="sampled"), model="m", stop_reason="endTurn"
    )


async def _elicit(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={})


def _capabilities(kind: str, root: str = "file:///work/alice") -> dict[str, Any]:
    if kind == "none":
        return {}
    return {
        "list_roots_callback": _roots(root),
        "sampling_callback": _sample,
        "elicitation_callback": _elicit,
    }


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def _shown(tools: Any, prefix: str = "") -> dict[str, dict[str, Any]]:
    """Each tool as the client was shown it, named without ``prefix``."""
    shown: dict[str, dict[str, Any]] = {}
    for tool in tools.tools:
        assert tool.name.startswith(prefix), tool.name
        definition = tool.model_dump(mode="json", exclude_none=True)
        definition["name"] = tool.name[len(prefix) :]
        shown[definition["name"]] = definition
    return shown


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("kind", ["none", FULL])
async def test_tools_list_through_bastion_equals_direct_for_the_same_capabilities(
    tmp_path: Path, everything_url: str, kind: str, mode: str
) -> None:
    """server-everything over HTTP shows a client through Bastion exactly the tools (definitions
    included) it shows that client directly, with or without roots, sampling and elicitation."""
    async with _gateway(tmp_path, {"everything": {"url": everything_url}}) as gateway:
        with anyio.fail_after(60):
            async with _direct(everything_url, **_capabilities(kind)) as direct:
                expected = _shown(await direct.list_tools())
            async with gateway.client(mode=mode, **_capabilities(kind)) as client:
                seen = _shown(await client.list_tools(), "everything__")
    assert seen == expected
    if kind == "none":
        assert not GATED & set(seen)
    else:
        assert set(seen) >= GATED


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_capability_gated_tool_answers_each_client_with_its_own_roots(
    tmp_path: Path, everything_url: str, mode: str
) -> None:
    """``get-roots-list`` (offered only to clients that declared roots) works through Bastion, and two
    agents calling it at once each get their own roots, never the other's."""
    async with _gateway(tmp_path, {"everything": {"url": everything_url}}) as gateway:
        answers: dict[str, str] = {}

        async def ask(agent: str) -> None:
            async with gateway.client(
                agent, mode=mode, **_capabilities(FULL, f"file:///work/{agent}")
            ) as client:
                answers[agent] = _text(await client.call_tool("everything__get-roots-list", {}))
                sampled = await client.call_tool(
                    "everything__trigger-sampling-request", {"prompt": "hi", "maxTokens": 5}
                )
                answers[agent + ":sampling"] = _text(sampled)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "alice")
                tg.start_soon(ask, "bob")
    assert "file:///work/alice" in answers["alice"] and "file:///work/bob" not in answers["alice"]
    assert "file:///work/bob" in answers["bob"] and "file:///work/alice" not in answers["bob"]
    assert "sampled" in answers["alice:sampling"] and "sampled" in answers["bob:sampling"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_roots_asked_on_the_standalone_stream_inside_a_tool_are_answered_by_the_caller(
    tmp_path: Path, fastmcp2_url: str, mode: str
) -> None:
    """A FastMCP 2.x tool's ``ctx.list_roots()`` (an ``mcp`` 1.x request on the session's GET stream)
    is answered through Bastion, in both client eras, by the calling client alone, within seconds."""
    async with _gateway(tmp_path, {"s": {"url": fastmcp2_url}}) as gateway:
        answers: dict[str, str] = {}

        async def ask(agent: str) -> None:
            async with gateway.client(
                agent, mode=mode, list_roots_callback=_roots(f"file:///work/{agent}")
            ) as client:
                answers[agent] = _text(await client.call_tool("s__which_roots", {}))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "alice")
                tg.start_soon(ask, "bob")
    assert answers == {"alice": "file:///work/alice", "bob": "file:///work/bob"}


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # logging/setLevel
async def test_log_messages_between_calls_reach_the_session_that_set_the_level_and_no_other(
    tmp_path: Path, fastmcp2_url: str
) -> None:
    """After ``logging/setLevel``, log messages an upstream sends once a call has returned reach that
    session-era client (all of them) and not another client that also set a level."""
    heard: dict[str, list[str]] = {"alice": [], "bob": []}
    all_heard = anyio.Event()

    def hearing(agent: str) -> Any:
        async def on_log(params: Any) -> None:
            heard[agent].append(str(params.data))
            if len(heard["alice"]) >= 3:
                all_heard.set()

        return on_log

    async with _gateway(tmp_path, {"s": {"url": fastmcp2_url}}) as gateway:
        with anyio.fail_after(30):
            async with (
                gateway.client("alice", logging_callback=hearing("alice")) as alice,
                gateway.client("bob", logging_callback=hearing("bob")) as bob,
            ):
                await alice.set_logging_level("info")
                await bob.set_logging_level("info")
                # Bob's own upstream session is open and followed too; nothing is sent on it.
                assert _text(await bob.call_tool("s__tick_later", {"count": 0})) == "scheduled"
                assert _text(await alice.call_tool("s__tick_later", {"count": 3})) == "scheduled"
                await all_heard.wait()
                await anyio.sleep(0.5)  # what would reach bob by mistake arrives with alice's
                upstream = gateway.gateway.fleet.upstreams["s"]
                assert isinstance(upstream, HttpUpstream)
                assert upstream.followed_streams == 2  # one GET stream per client's own upstream session
            while upstream.followed_streams:  # each is closed with its session
                await anyio.sleep(0.05)
    assert heard["alice"] == ["tick 0", "tick 1", "tick 2"]
    assert heard["bob"] == []


async def test_a_list_change_on_a_client_s_own_upstream_session_reaches_that_client_only(
    tmp_path: Path, fastmcp2_url: str
) -> None:
    """A ``tools/list_changed`` the upstream sends on alice's own upstream session tells alice (the new
    tool is then listed and callable for her) and not bob."""
    told: dict[str, int] = {"alice": 0, "bob": 0}
    alice_told = anyio.Event()

    def watching(agent: str) -> Any:
        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                told[agent] += 1
                if agent == "alice":
                    alice_told.set()

        return on_message

    async with _gateway(tmp_path, {"s": {"url": fastmcp2_url}}) as gateway:
        with anyio.fail_after(30):
            async with (
                gateway.client("alice", message_handler=watching("alice")) as alice,
                gateway.client("bob", message_handler=watching("bob")) as bob,
            ):
                assert "s__fresh_a" not in {t.name for t in (await alice.list_tools()).tools}
                assert "s__fresh_a" not in {t.name for t in (await bob.list_tools()).tools}
                assert _text(await alice.call_tool("s__grow", {"name": "fresh_a"})) == "grown"
                await alice_told.wait()
                listed = {t.name for t in (await alice.list_tools()).tools}
                called = _text(await alice.call_tool("s__fresh_a", {}))
                await anyio.sleep(0.5)  # what would reach bob by mistake arrives with alice's
    assert "s__fresh_a" in listed
    assert called == "fresh_a is here"
    assert told["alice"] >= 1  # FastMCP announces an added tool itself, and the tool announces it again
    assert told["bob"] == 0
