"""What an owned stdio process sends between calls reaches its owner alone (issue 22 point 3).

A stdio server written for one client per process speaks to "its" client whenever it likes:
a ``roots/list`` asked after a tool returned, log messages after ``logging/setLevel``, a
``tools/list_changed``. Behind the real gateway, each session-era client has its own process
(``servers.NAME.scope`` ``transport_session``), and what that process sends outside a call goes
to that client's GET stream (``session/server_channel.py``) and to no other client; its tools/list
is what its own process shows a client with its capabilities (server-everything, direct alike).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import ListRootsResult, Root

from bastion.auth.bearer import hash_token
from tests.e2e.conftest import TOKENS, RunningGateway
from tests.e2e.test_capability_views_e2e import _elicit, _gateway, _sample
from tests.e2e.test_serve_process import Serve
from tests.e2e.test_serve_process import serving as serving  # the fixture
from tests.e2e.third_party.servers import fastmcp_python, npm_server

pytestmark = pytest.mark.anyio

SPEAKER = Path(__file__).parent / "third_party" / "fastmcp2_stdio_server.py"


def _speaker() -> dict[str, Any]:
    return {"command": fastmcp_python(2), "args": ["-W", "ignore", str(SPEAKER)], "timeout_s": 30.0}


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def test_roots_asked_between_calls_are_answered_by_the_process_owner_alone(tmp_path: Path) -> None:
    """Each client's process asks ``roots/list`` after its call returned: each client answers its own
    process on its GET stream (its roots, never the other's)."""
    answers: dict[str, str] = {}
    async with _gateway(tmp_path, {"s": _speaker()}) as gateway:

        async def ask(agent: str) -> None:
            asked = anyio.Event()

            async def list_roots(context: Any) -> ListRootsResult:
                asked.set()
                return ListRootsResult(roots=[Root(uri=f"file:///work/{agent}", name=agent)])  # type: ignore[arg-type]

            async with gateway.client(agent, list_roots_callback=list_roots) as client:
                assert _text(await client.call_tool("s__roots_later", {})) == "asking"
                await asked.wait()  # on the GET stream: no call of this client is in flight
                for _ in range(100):  # the process writes the answer down once it has it
                    answers[agent] = _text(await client.call_tool("s__last_roots", {}))
                    if answers[agent]:
                        break
                    await anyio.sleep(0.05)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "alice")
                tg.start_soon(ask, "bob")
    assert answers == {"alice": "file:///work/alice", "bob": "file:///work/bob"}


async def test_roots_between_calls_are_refused_when_the_owner_cannot_answer(tmp_path: Path) -> None:
    """A client that declared no roots capability is never asked: its process gets an error."""
    async with _gateway(tmp_path, {"s": _speaker()}) as gateway:
        with anyio.fail_after(30):
            async with gateway.client("alice") as client:
                assert _text(await client.call_tool("s__roots_later", {})) == "asking"
                answer = ""
                while not answer:
                    answer = _text(await client.call_tool("s__last_roots", {}))
                    await anyio.sleep(0.05)
    assert answer.startswith("refused")


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # logging/setLevel
async def test_log_messages_between_calls_reach_the_process_owner_and_no_other(tmp_path: Path) -> None:
    """After ``logging/setLevel``, log messages a process sends once its call has returned reach its
    owner (all of them) and not another client that also set a level."""
    heard: dict[str, list[str]] = {"alice": [], "bob": []}
    all_heard = anyio.Event()

    def hearing(agent: str) -> Any:
        async def on_log(params: Any) -> None:
            heard[agent].append(str(params.data))
            if len(heard["alice"]) >= 3:
                all_heard.set()

        return on_log

    async with _gateway(tmp_path, {"s": _speaker()}) as gateway:
        with anyio.fail_after(30):
            async with (
                gateway.client("alice", logging_callback=hearing("alice")) as alice,
                gateway.client("bob", logging_callback=hearing("bob")) as bob,
            ):
                await alice.set_logging_level("info")
                await bob.set_logging_level("info")
                assert _text(await bob.call_tool("s__tick_later", {"count": 0})) == "scheduled"
                assert _text(await alice.call_tool("s__tick_later", {"count": 3})) == "scheduled"
                await all_heard.wait()
                await anyio.sleep(0.5)  # what would reach bob by mistake arrives with alice's
    assert heard["alice"] == ["tick 0", "tick 1", "tick 2"]
    assert heard["bob"] == []


async def test_a_list_change_of_an_owned_process_reaches_its_owner_only(tmp_path: Path) -> None:
    """A ``tools/list_changed`` from alice's process tells alice, and the new tool is then listed and
    callable for her; bob is not told and does not list it."""
    told: dict[str, int] = {"alice": 0, "bob": 0}
    alice_told = anyio.Event()

    def watching(agent: str) -> Any:
        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                told[agent] += 1
                if agent == "alice":
                    alice_told.set()

        return on_message

    async with _gateway(tmp_path, {"s": _speaker()}) as gateway:
        with anyio.fail_after(30):
            async with (
                gateway.client("alice", message_handler=watching("alice")) as alice,
                gateway.client("bob", message_handler=watching("bob")) as bob,
            ):
                assert _text(await bob.call_tool("s__last_roots", {})) == ""  # bob has a process too
                assert _text(await alice.call_tool("s__grow", {"name": "fresh_a"})) == "grown"
                await alice_told.wait()
                listed = {t.name for t in (await alice.list_tools()).tools}
                called = _text(await alice.call_tool("s__fresh_a", {}))
                bob_listed = {t.name for t in (await bob.list_tools()).tools}
                await anyio.sleep(0.5)  # what would reach bob by mistake arrives with alice's
    assert "s__fresh_a" in listed
    assert called == "fresh_a is here"
    assert "s__fresh_a" not in bob_listed
    assert told["alice"] >= 1
    assert told["bob"] == 0


async def _direct_tools(command: list[str], **callbacks: Any) -> set[str]:
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with Client(params, mode="legacy", **callbacks) as client:
        return {tool.name for tool in (await client.list_tools()).tools}


async def test_tools_list_of_an_owned_process_equals_direct_for_the_same_capabilities(tmp_path: Path) -> None:
    """server-everything over stdio offers some tools only to a client that can answer them: through
    Bastion each client lists what its own process shows it, as the same client going direct does."""
    everything = npm_server("everything", "stdio")
    able = {
        "list_roots_callback": lambda context: _no_roots(),
        "sampling_callback": _sample,
        "elicitation_callback": _elicit,
    }
    with anyio.fail_after(90):
        direct_plain = await _direct_tools(everything)
        direct_able = await _direct_tools(everything, **able)
        assert direct_plain != direct_able  # the server gates tools on the client's capabilities
        server = {"command": everything[0], "args": everything[1:], "timeout_s": 30.0}
        async with (
            _gateway(tmp_path, {"e": server}) as gateway,
            gateway.client("alice") as plain,
            gateway.client("bob", **able) as capable,
        ):
            await plain.call_tool("e__echo", {"message": "hi"})  # each client's process now runs
            await capable.call_tool("e__echo", {"message": "hi"})
            through_plain = {t.name.removeprefix("e__") for t in (await plain.list_tools()).tools}
            through_able = {t.name.removeprefix("e__") for t in (await capable.list_tools()).tools}
    assert through_plain == direct_plain
    assert through_able == direct_able


async def _no_roots() -> ListRootsResult:
    return ListRootsResult(roots=[])


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # logging/setLevel
async def test_through_bastion_serve_each_process_speaks_to_its_owner_alone(
    tmp_path: Path, serving: list[Serve]
) -> None:
    """Through the `bastion serve` process: each client's process asks its roots between calls and
    gets that client's; alice's process logs between calls to alice and not to bob."""
    speaker = _speaker()
    agents = "".join(
        f'[agents.{name}]\ntoken_sha256 = "{hash_token(token)}"\n' for name, token in TOKENS.items()
    )
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"[servers.s]\ncommand = {json.dumps(speaker['command'])}\nargs = {json.dumps(speaker['args'])}\n"
        + agents
    )
    serve = Serve("--config", str(config), "--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    url = await anyio.to_thread.run_sync(serve.ready_line)
    gateway = RunningGateway(url.split()[2], None, tmp_path)  # type: ignore[arg-type]
    answers: dict[str, str] = {}
    heard: dict[str, list[str]] = {"alice": [], "bob": []}
    alice_heard = anyio.Event()

    async def run(agent: str) -> None:
        asked = anyio.Event()

        async def list_roots(context: Any) -> ListRootsResult:
            asked.set()
            return ListRootsResult(roots=[Root(uri=f"file:///work/{agent}", name=agent)])  # type: ignore[arg-type]

        async def on_log(params: Any) -> None:
            heard[agent].append(str(params.data))
            if len(heard["alice"]) >= 2:
                alice_heard.set()

        async with gateway.client(agent, list_roots_callback=list_roots, logging_callback=on_log) as client:
            await client.set_logging_level("info")
            assert _text(await client.call_tool("s__roots_later", {})) == "asking"
            await asked.wait()
            while not answers.get(agent):
                answers[agent] = _text(await client.call_tool("s__last_roots", {}))
                await anyio.sleep(0.05)
            count = 2 if agent == "alice" else 0
            assert _text(await client.call_tool("s__tick_later", {"count": count})) == "scheduled"
            await alice_heard.wait()
            await anyio.sleep(0.5)  # what would reach bob by mistake arrives with alice's

    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "alice")
            tg.start_soon(run, "bob")
    assert answers == {"alice": "file:///work/alice", "bob": "file:///work/bob"}
    assert heard == {"alice": ["tick 0", "tick 1"], "bob": []}


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # logging/setLevel
async def test_an_agent_session_process_speaks_to_every_session_of_its_owner_alone(tmp_path: Path) -> None:
    """``scope = "agent_session"``: alice's two client sessions share one process; its log messages
    between calls reach both (each at its own level) and not bob, and a ``roots/list`` it asks between
    calls goes to the alice session that can answer it (the one that declared roots)."""
    heard: dict[str, list[str]] = {"alice-1": [], "alice-2": [], "bob": []}
    both_heard = anyio.Event()

    def hearing(who: str) -> Any:
        async def on_log(params: Any) -> None:
            heard[who].append(str(params.data))
            if len(heard["alice-1"]) >= 2 and len(heard["alice-2"]) >= 2:
                both_heard.set()

        return on_log

    roots_asked = anyio.Event()

    async def list_roots(context: Any) -> ListRootsResult:
        roots_asked.set()
        return ListRootsResult(roots=[Root(uri="file:///work/alice-2", name="alice-2")])  # type: ignore[arg-type]

    async with _gateway(tmp_path, {"s": {**_speaker(), "scope": "agent_session"}}) as gateway:
        with anyio.fail_after(45):
            async with (
                gateway.client("alice", logging_callback=hearing("alice-1")) as first,
                gateway.client(
                    "alice", logging_callback=hearing("alice-2"), list_roots_callback=list_roots
                ) as second,
                gateway.client("bob", logging_callback=hearing("bob")) as bob,
            ):
                for client in (first, second, bob):
                    await client.set_logging_level("info")
                    await client.call_tool("s__last_roots", {})  # each session now holds its process
                upstream = gateway.gateway.fleet.upstreams["s"]
                assert len(upstream.owned()) == 2  # type: ignore[attr-defined]  # alice's and bob's
                assert _text(await first.call_tool("s__tick_later", {"count": 2})) == "scheduled"
                await both_heard.wait()
                assert _text(await first.call_tool("s__roots_later", {})) == "asking"
                # Asked between calls: no call of alice's may be in flight then (one in flight would
                # take the request itself, and alice-1 declared no roots).
                await roots_asked.wait()
                answer = ""
                while not answer:
                    answer = _text(await first.call_tool("s__last_roots", {}))
                    await anyio.sleep(0.05)
                await anyio.sleep(0.3)  # what would reach bob by mistake arrives with alice's
    assert heard == {"alice-1": ["tick 0", "tick 1"], "alice-2": ["tick 0", "tick 1"], "bob": []}
    assert answer == "file:///work/alice-2"


async def test_a_sessionless_process_refuses_and_drops_between_calls_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Sessionless requests give an agent session's process no stream between calls: a ``roots/list``
    it asks then is refused to it, and its log messages are dropped, each with a log line."""
    caplog.set_level(logging.WARNING, logger="bastion.upstream.owner_channels")
    async with _gateway(tmp_path, {"s": _speaker()}) as gateway:
        with anyio.fail_after(30):
            async with gateway.client("alice", mode="auto") as client:
                assert _text(await client.call_tool("s__roots_later", {})) == "asking"
                # Refused between calls (no call in flight: one would take the request itself).
                while not any("roots/list between calls" in r.getMessage() for r in caplog.records):
                    await anyio.sleep(0.05)
                answer = ""
                while not answer:
                    answer = _text(await client.call_tool("s__last_roots", {}))
                    await anyio.sleep(0.05)
                assert _text(await client.call_tool("s__tick_later", {"count": 1})) == "scheduled"
                while not any("dropped" in r.getMessage() for r in caplog.records):
                    await anyio.sleep(0.05)
    assert answer.startswith("refused")
    messages = [record.getMessage() for record in caplog.records]
    assert any("roots/list between calls" in m and "refused" in m for m in messages), messages
    assert any("notifications/message between calls" in m and "dropped" in m for m in messages), messages
