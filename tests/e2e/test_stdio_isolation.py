"""No stdio process state crosses agents or sessions (issue 22 point 1, DESIGN section 5).

Third-party stdio servers nobody on this team wrote (server-memory, server-everything,
server-sequential-thinking) behind the real gateway, two agents and 32 concurrent SDK clients:
what one client writes no other client reads, roots never cross, a bound refuses
``upstream_capacity`` instead of sharing, an idle process is stopped, and a session's process
ends with the session.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import ListRootsResult, Root

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.upstream.stdio import StdioUpstream
from bastion.upstream.streamable_http import HttpUpstreamSession
from bastion.workers.attachment import sessionless_ref
from bastion.workers.liveness import pid_alive, this_host
from bastion.workers.registry import describe_workers
from tests.e2e.conftest import TOKENS, RunningGateway, Upstream
from tests.e2e.issue4_support import (
    base_config,
    create_agent_session,
    entries_with_event,
    file_gateway,
    revoke_agent_session,
    sdk_client,
    write_config,
)
from tests.e2e.test_capability_views_e2e import _elicit, _sample
from tests.e2e.test_serve_process import Serve
from tests.e2e.test_serve_process import serving as serving  # the fixture
from tests.e2e.third_party.servers import npm_server
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

CLIENTS = 32  # two agents, sixteen each, all at once


def _stdio(command: list[str], **extra: Any) -> dict[str, Any]:
    return {"command": command[0], "args": command[1:], "timeout_s": 60.0, **extra}


def _config(servers: dict[str, Any], **gateway: Any) -> dict[str, Any]:
    return {
        "gateway": {"upstream_timeout_s": 90.0, **gateway},
        "servers": servers,
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[RunningGateway]:
    snapshot = snapshot_from_mapping(config, source=None, version="test")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        yield RunningGateway(url, app.state.gateway, tmp_path)


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def _agent(index: int) -> str:
    return "alice" if index % 2 else "bob"


async def _all_at_once(count: int, client_run: Any) -> None:
    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for index in range(count):
                tg.start_soon(client_run, index)


def _memory_server() -> dict[str, Any]:
    # server-memory keeps its graph in a file: each process gets its own (`{process_dir}`).
    return _stdio(
        npm_server("memory"), env={"MEMORY_FILE_PATH": "{process_dir}/memory.jsonl"}, max_processes=40
    )


async def test_server_memory_state_never_crosses_agents_or_sessions(tmp_path: Path) -> None:
    """32 concurrent clients of two agents each store an entity; each one's read_graph shows only its
    own, and a later session of the same agent starts from an empty graph."""
    async with _gateway(tmp_path, _config({"memory": _memory_server()})) as gateway:
        graphs: dict[int, set[str]] = {}

        async def client_run(index: int) -> None:
            async with gateway.client(_agent(index)) as client:
                await client.call_tool(
                    "memory__create_entities",
                    {"entities": [{"name": f"secret-{index}", "entityType": "note", "observations": ["x"]}]},
                )
                graph = json.loads(_text(await client.call_tool("memory__read_graph", {})))
                graphs[index] = {entity["name"] for entity in graph["entities"]}

        await _all_at_once(CLIENTS, client_run)
        assert graphs == {index: {f"secret-{index}"} for index in range(CLIENTS)}
        async with gateway.client("alice") as later:
            graph = json.loads(_text(await later.call_tool("memory__read_graph", {})))
        assert graph["entities"] == []  # another session of alice: its own process, its own file


async def test_sessionless_requests_get_their_agents_process(tmp_path: Path) -> None:
    """In the sessionless era a process is the agent session's (here: the agent's): alice's requests
    share one, bob never reads it."""
    async with _gateway(tmp_path, _config({"memory": _memory_server()})) as gateway:
        async with gateway.client("alice", mode="auto") as alice:
            await alice.call_tool(
                "memory__create_entities",
                {"entities": [{"name": "alice-only", "entityType": "note", "observations": []}]},
            )
        async with (
            gateway.client("alice", mode="auto") as alice_again,
            gateway.client("bob", mode="auto") as bob,
        ):
            mine = json.loads(_text(await alice_again.call_tool("memory__read_graph", {})))
            theirs = json.loads(_text(await bob.call_tool("memory__read_graph", {})))
    assert [entity["name"] for entity in mine["entities"]] == ["alice-only"]
    assert theirs["entities"] == []


async def test_server_everything_roots_answer_each_client_with_its_own(tmp_path: Path) -> None:
    """get-roots-list through Bastion answers each of 32 concurrent clients with its own roots: the
    tool is offered (its process was told the client has roots) and never names another's."""
    config = _config({"everything": _stdio(npm_server("everything", "stdio"), max_processes=40)})
    async with _gateway(tmp_path, config) as gateway:
        answers: dict[int, str] = {}

        async def client_run(index: int) -> None:
            async def roots(context: Any) -> ListRootsResult:
                return ListRootsResult(roots=[Root(uri=f"file:///clients/client-{index}")])  # type: ignore[arg-type]

            async with gateway.client(_agent(index), list_roots_callback=roots) as client:
                answers[index] = _text(await client.call_tool("everything__get-roots-list", {}))

        await _all_at_once(CLIENTS, client_run)
    for index, answer in answers.items():
        assert f"file:///clients/client-{index}" in answer, answer
        others = [i for i in range(CLIENTS) if i != index and f"/client-{i}\n" in answer + "\n"]
        assert not others and answer.count("file:///clients/") == 1, answer
    assert len(answers) == CLIENTS


async def test_sequential_thinking_history_never_carries_over(tmp_path: Path) -> None:
    """Each of 32 concurrent clients thinks one thought and its history holds that one thought."""
    config = _config({"thinking": _stdio(npm_server("sequential-thinking"), max_processes=40)})
    async with _gateway(tmp_path, config) as gateway:
        lengths: dict[int, int] = {}

        async def client_run(index: int) -> None:
            async with gateway.client(_agent(index)) as client:
                result = await client.call_tool(
                    "thinking__sequentialthinking",
                    {
                        "thought": f"t{index}",
                        "nextThoughtNeeded": True,
                        "thoughtNumber": 1,
                        "totalThoughts": 3,
                    },
                )
                lengths[index] = json.loads(_text(result))["thoughtHistoryLength"]

        await _all_at_once(CLIENTS, client_run)
    assert lengths == dict.fromkeys(range(CLIENTS), 1)


def _notes_server(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "bastion.examples.notes_server"],
        "env": {"BASTION_NOTES_FILE": "{process_dir}/notes.jsonl"},
        "timeout_s": 30.0,
        **extra,
    }


async def test_at_the_bound_a_call_is_refused_never_shared(tmp_path: Path) -> None:
    """With two processes allowed, a third client session is refused ``upstream_capacity`` (audited);
    the two running processes stay their owners' alone, and a freed slot serves a new owner."""
    config = _config({"notes": _notes_server(tmp_path, max_processes=2)})
    async with _gateway(tmp_path, config) as gateway:
        upstream = gateway.gateway.fleet.upstreams["notes"]
        assert isinstance(upstream, StdioUpstream)
        async with gateway.client("alice") as first, gateway.client("bob") as second:
            await first.call_tool("notes__echo", {"text": "one"})
            await second.call_tool("notes__echo", {"text": "two"})
            held = set(upstream.owned())
            async with gateway.client("alice") as third:
                with pytest.raises(MCPError) as refused:
                    await third.session.call_tool("notes__echo", {"text": "three"})
            assert set(upstream.owned()) == held
        assert refused.value.error.data["reason"] == "upstream_capacity"
        assert refused.value.error.data["bound"] == "server"
        with anyio.fail_after(15):  # both sessions ended: their processes stopped, slots free
            while upstream.owned():
                await anyio.sleep(0.05)
        async with gateway.client("alice") as fourth:
            assert _text(await fourth.call_tool("notes__echo", {"text": "four"})) == "four"
    refusals = [
        e
        for e in entries_with_event(tmp_path / "data" / "bastion.db", "failed")
        if e["reason"] == "upstream_capacity"
    ]
    assert len(refusals) == 1 and (refusals[0]["server"], refusals[0]["tool"]) == ("notes", "echo")


async def test_the_gateway_wide_bound_counts_every_server(tmp_path: Path) -> None:
    """``gateway.max_stdio_processes`` bounds processes over all servers together."""
    servers = {"a": _notes_server(tmp_path), "b": _notes_server(tmp_path)}
    async with (
        _gateway(tmp_path, _config(servers, max_stdio_processes=1)) as gateway,
        gateway.client("alice") as client,
    ):
        await client.call_tool("a__echo", {"text": "one"})
        with pytest.raises(MCPError) as refused:
            await client.session.call_tool("b__echo", {"text": "two"})
    assert refused.value.error.data["reason"] == "upstream_capacity"
    assert refused.value.error.data["bound"] == "gateway"


async def test_an_idle_process_is_reaped_and_a_new_one_serves_its_owner(tmp_path: Path) -> None:
    """After ``process_idle_s`` with no call the owner's process is stopped (its PID gone); the
    owner's next call starts a fresh one."""
    config = _config({"notes": _notes_server(tmp_path, process_idle_s=0.3)})
    async with _gateway(tmp_path, config) as gateway:
        upstream = gateway.gateway.fleet.upstreams["notes"]
        assert isinstance(upstream, StdioUpstream)
        async with gateway.client("alice") as client:
            await client.call_tool("notes__echo", {"text": "one"})
            (process,) = upstream.owned().values()
            pid = process.pid
            assert pid is not None
            with anyio.fail_after(15):
                while upstream.owned():
                    await anyio.sleep(0.05)
                while _alive(pid):
                    await anyio.sleep(0.05)
            assert _text(await client.call_tool("notes__echo", {"text": "two"})) == "two"
            (again,) = upstream.owned().values()
            assert again is not process and again.pid != pid


async def test_a_session_delete_stops_only_its_process(tmp_path: Path) -> None:
    """A client that ends its session (DELETE) stops its own process; another session's goes on."""
    async with _gateway(tmp_path, _config({"notes": _notes_server(tmp_path)})) as gateway:
        upstream = gateway.gateway.fleet.upstreams["notes"]
        assert isinstance(upstream, StdioUpstream)
        async with gateway.client("bob") as bob:
            await bob.call_tool("notes__echo", {"text": "b"})
            bob_process = next(iter(upstream.owned().values()))
            async with gateway.client("alice") as alice:
                await alice.call_tool("notes__echo", {"text": "a"})
                alice_process = next(p for p in upstream.owned().values() if p is not bob_process)
                alice_pid = alice_process.pid
            with anyio.fail_after(15):
                while alice_pid is not None and _alive(alice_pid):
                    await anyio.sleep(0.05)
            assert list(upstream.owned().values()) == [bob_process]
            assert _text(await bob.call_tool("notes__echo", {"text": "still"})) == "still"


async def test_an_owned_process_is_a_worker_with_its_owner(tmp_path: Path) -> None:
    """Each launched process registers its own worker identity and slot, its owner in its provenance."""
    async with _gateway(tmp_path, _config({"notes": _notes_server(tmp_path)})) as gateway:
        upstream = gateway.gateway.fleet.upstreams["notes"]
        assert isinstance(upstream, StdioUpstream)
        async with gateway.client("alice") as alice, gateway.client("bob") as bob:
            await alice.call_tool("notes__echo", {"text": "a"})
            await bob.call_tool("notes__echo", {"text": "b"})
            owners = set(upstream.owned())
            runtimes = gateway.gateway.runtimes
            assert runtimes is not None
            with anyio.fail_after(15):
                while any(runtimes.current(f"notes:{owner}") is None for owner in owners):
                    await anyio.sleep(0.05)
            workers = {runtimes.current(f"notes:{owner}").worker for owner in owners}  # type: ignore[union-attr]
            listing = runtimes.current("notes")
            assert listing is not None and listing.worker not in workers and len(workers) == 2
            store = gateway.gateway.store
            assert store is not None
            records = [await store.get_worker(worker) for worker in workers]
            assert {r.provenance["owner"] for r in records if r is not None} == owners
            slots = {runtimes.slot(f"notes:{owner}") for owner in owners}
            assert len(slots) == 2
            # `bastion workers` names each process's owner from its live attachment record.
            with anyio.fail_after(15):
                while True:
                    views = await describe_workers(
                        store, now=datetime.now(UTC), lease_s=None, pid_alive=pid_alive, this_host=this_host()
                    )
                    shown = {v.worker_id: v.owning_sessions for v in views if v.worker_id in workers}
                    if all(shown.get(w) for w in workers):
                        break
                    await anyio.sleep(0.05)
            assert {owner for sessions in shown.values() for owner in sessions or ()} == owners
            assert all(len(sessions or ()) == 1 for sessions in shown.values())


async def test_http_session_era_upstream_gets_one_upstream_session_per_client_session(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Shown, as issue 22 asks: 32 concurrent client sessions of two agents, each with an upstream
    session of its own at a session-era HTTP upstream, none shared."""
    config = _config({"tools": {"url": tools_upstream.url, "era": "session"}})
    async with _gateway(tmp_path, config) as gateway:
        live = anyio.Semaphore(0)
        release = anyio.Event()
        seen: dict[str, tuple[str, str]] = {}

        async def client_run(index: int) -> None:
            async with gateway.client(_agent(index)) as client:
                assert _text(await client.call_tool("tools__echo", {"text": str(index)})) == str(index)
                live.release()
                await release.wait()

        with anyio.fail_after(240):
            async with anyio.create_task_group() as tg:
                for index in range(CLIENTS):
                    tg.start_soon(client_run, index)
                for _ in range(CLIENTS):
                    await live.acquire()
                for transport_session in gateway.gateway.registry:  # every session is live now
                    upstream_session = transport_session.upstream_sessions.get("tools")
                    assert isinstance(upstream_session, HttpUpstreamSession) and upstream_session.session_id
                    seen[transport_session.id] = (transport_session.agent, upstream_session.session_id)
                release.set()
    assert len(seen) == CLIENTS
    assert len({upstream_session_id for _, upstream_session_id in seen.values()}) == CLIENTS
    assert {agent for agent, _ in seen.values()} == {"alice", "bob"}


async def _no_roots(context: Any) -> ListRootsResult:
    return ListRootsResult(roots=[])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _serve_config(tmp_path: Path) -> Path:
    memory = npm_server("memory")
    everything = npm_server("everything", "stdio")
    agents = "".join(
        f'[agents.{name}]\ntoken_sha256 = "{hash_token(token)}"\n' for name, token in TOKENS.items()
    )
    path = tmp_path / "gateway.toml"
    path.write_text(
        # 32 clients of two servers need 64 processes: the gateway-wide default exactly; leave room.
        "[gateway]\nupstream_timeout_s = 90.0\nmax_stdio_processes = 80\n"
        f"[servers.memory]\ncommand = {json.dumps(memory[0])}\nargs = {json.dumps(memory[1:])}\n"
        'env = { MEMORY_FILE_PATH = "{process_dir}/memory.jsonl" }\nmax_processes = 40\ntimeout_s = 60.0\n'
        f"[servers.everything]\ncommand = {json.dumps(everything[0])}\nargs = {json.dumps(everything[1:])}\n"
        "max_processes = 40\ntimeout_s = 60.0\n" + agents
    )
    return path


async def test_through_bastion_serve_no_state_or_roots_cross_concurrent_clients(
    tmp_path: Path, serving: list[Serve]
) -> None:
    """The same probes through the `bastion serve` process an operator runs: 32 concurrent clients of
    two agents (64 Node processes), each with its own server-memory graph and its own roots."""
    serve = Serve("--config", str(_serve_config(tmp_path)), "--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    url = await anyio.to_thread.run_sync(serve.ready_line)
    gateway = RunningGateway(url.split()[2], None, tmp_path)  # type: ignore[arg-type]
    seen: dict[int, tuple[set[str], str]] = {}

    async def client_run(index: int) -> None:
        async def roots(context: Any) -> ListRootsResult:
            return ListRootsResult(roots=[Root(uri=f"file:///clients/client-{index}")])  # type: ignore[arg-type]

        async with gateway.client(_agent(index), list_roots_callback=roots) as client:
            await client.call_tool(
                "memory__create_entities",
                {"entities": [{"name": f"secret-{index}", "entityType": "note", "observations": []}]},
            )
            graph = json.loads(_text(await client.call_tool("memory__read_graph", {})))
            answer = _text(await client.call_tool("everything__get-roots-list", {}))
            seen[index] = ({entity["name"] for entity in graph["entities"]}, answer)

    await _all_at_once(CLIENTS, client_run)
    for index, (names, answer) in seen.items():
        assert names == {f"secret-{index}"}
        assert answer.count("file:///clients/") == 1 and f"file:///clients/client-{index}" in answer, answer
    assert len(seen) == CLIENTS


async def test_server_everything_offers_its_capability_gated_tools(tmp_path: Path) -> None:
    """The catalog's listing process declares every capability Bastion bridges (URL-mode elicitation
    included), so server-everything over stdio lists the four tools it registers only for clients
    that can answer them (issue 22 point 2); a client that can answer them lists them too, from its
    own process (one that cannot does not: ``test_stdio_owned_surface.py``)."""
    config = _config({"everything": _stdio(npm_server("everything", "stdio"))})
    able = {"list_roots_callback": _no_roots, "sampling_callback": _sample, "elicitation_callback": _elicit}
    async with _gateway(tmp_path, config) as gateway, gateway.client("alice", **able) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        catalog = set(gateway.gateway.fleet.catalog)
    gated = {
        "get-roots-list",
        "trigger-sampling-request",
        "trigger-elicitation-request",
        "trigger-url-elicitation",
    }
    assert {f"everything__{name}" for name in gated} <= names & catalog


async def test_revoking_an_agent_session_stops_only_its_process(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Sessionless requests of two agent sessions run on two processes; revoking one agent session
    stops its process at once, and the other's goes on serving."""
    path = tmp_path / "bastion.toml"
    write_config(path, base_config(tmp_path, tools_upstream.url))
    async with file_gateway(path, tmp_path / "data") as gw, httpx.AsyncClient(timeout=30) as http:
        upstream = gw.gateway.fleet.upstreams["notes"]
        assert isinstance(upstream, StdioUpstream)
        revoked = await create_agent_session(http, gw.origin, agent="carol")
        kept = await create_agent_session(http, gw.origin, agent="carol", human="dave@example.com")
        for session in (revoked, kept):
            async with sdk_client(gw.url, session.token, mode="auto") as client:
                assert _text(await client.call_tool("notes__echo", {"text": "x"})) == "x"
        processes = upstream.owned()
        assert len(processes) == 2
        gone = processes[sessionless_ref("carol", revoked.agent_session_id)]
        stays = processes[sessionless_ref("carol", kept.agent_session_id)]
        pid = gone.pid
        assert pid is not None
        await revoke_agent_session(http, gw.origin, revoked.agent_session_id)
        assert list(upstream.owned().values()) == [stays]
        with anyio.fail_after(15):
            while _alive(pid):
                await anyio.sleep(0.05)
        async with sdk_client(gw.url, kept.token, mode="auto") as client:
            assert _text(await client.call_tool("notes__echo", {"text": "y"})) == "y"
        assert upstream.owned() == {sessionless_ref("carol", kept.agent_session_id): stays}


async def test_server_filesystem_allows_each_client_only_its_own_roots(tmp_path: Path) -> None:
    """server-filesystem takes its allowed directories from the client's roots: through Bastion each of
    32 concurrent clients is allowed exactly its own directory and cannot read another client's file."""
    base = tmp_path / "base"
    base.mkdir()
    dirs = [tmp_path / f"client-{index}" for index in range(CLIENTS)]
    for index, directory in enumerate(dirs):
        directory.mkdir()
        (directory / "secret.txt").write_text(f"secret of client {index}\n")
    config = _config({"fs": _stdio(npm_server("filesystem", str(base)), max_processes=40)})
    async with _gateway(tmp_path, config) as gateway:
        allowed: dict[int, str] = {}
        own: dict[int, str] = {}
        other: dict[int, str] = {}

        async def client_run(index: int) -> None:
            async def roots(context: Any) -> ListRootsResult:
                return ListRootsResult(roots=[Root(uri=dirs[index].as_uri())])  # type: ignore[arg-type]

            neighbour = dirs[(index + 1) % CLIENTS] / "secret.txt"
            async with gateway.client(_agent(index), list_roots_callback=roots) as client:
                # The server asks for roots after `initialized` and applies them when they come, as it
                # does directly: a first call may still see its command-line directory.
                with anyio.fail_after(60):
                    while str(dirs[index]) not in (
                        listed := _text(await client.call_tool("fs__list_allowed_directories", {}))
                    ):
                        await anyio.sleep(0.1)
                allowed[index] = listed
                read = await client.call_tool("fs__read_text_file", {"path": str(dirs[index] / "secret.txt")})
                own[index] = _text(read)
                refused = await client.call_tool("fs__read_text_file", {"path": str(neighbour)})
                assert refused.is_error, _text(refused)
                other[index] = _text(refused)

        await _all_at_once(CLIENTS, client_run)
    for index in range(CLIENTS):
        assert str(dirs[index]) in allowed[index], allowed[index]
        assert str(base) not in allowed[index] and allowed[index].count(str(tmp_path)) == 1, allowed[index]
        assert own[index] == f"secret of client {index}\n", own[index]
        assert "secret of client" not in other[index], other[index]
