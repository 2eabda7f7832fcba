"""2025-11-25 tasks through a real ``bastion serve``, against server-everything on stdio (issue 24).

The lifecycle transcript (``tasks_lifecycle.py``, raw JSON-RPC) through the gateway equals the
one direct, to a stdio and to a Streamable HTTP upstream, and so does what the TypeScript SDK's
experimental task API sees (``ts_client/tasks_client.mjs``); a
second agent probing the first's task id gets the answer an unknown id gets; the execution that
created a task is settled when the task is, and its replay is the same task, never a second.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bastion.auth.bearer import hash_token
from bastion.versions import HANDSHAKE_VERSIONS, TASKS_VERSIONS
from tests.e2e.issue4_support import (
    ACCEPT,
    ADMIN_TOKEN,
    create_agent_session,
    messages_of,
    reload_policy,
    revoke_agent_session,
)
from tests.e2e.tasks_lifecycle import TASKS_CAPABILITY, Exchange, lifecycle, stdio_exchange
from tests.e2e.test_capability_views_e2e import everything_url
from tests.e2e.test_shared_evidence_crash import bastion_serve
from tests.e2e.test_ts_client import CLIENT_DIR as TS_CLIENT_DIR
from tests.e2e.test_ts_client import _node as ts_node
from tests.e2e.third_party.servers import npm_server

pytestmark = pytest.mark.anyio

__all__ = ["everything_url"]  # the fixture, used by name

VERSION = "2025-11-25"
TOKENS = {"alice": "alice-tasks-token", "bob": "bob-tasks-token"}
RESEARCH = ("simulate-research-query", {"topic": "gateways"})
DEADLINE_S = 90


def write_config(path: Path, granted: tuple[str, ...] | None = None, *, url: str | None = None) -> Path:
    """The gateway's file: server-everything on stdio, or at ``url``; with ``granted``, grants of
    every tool of the server to those agents only."""
    if url is None:
        command = npm_server("everything", "stdio")
        args = ", ".join(f'"{arg}"' for arg in command[1:])
        server = f'command = "{command[0]}"\nargs = [{args}]'
    else:
        server = f'url = "{url}"'
    grants = "".join(
        f'\n[[grants]]\nagent = "{agent}"\nservers = ["everything"]\ntools = ["*"]\n'
        for agent in granted or ()
    )
    agents = "".join(f'[agents.{name}]\ntoken_sha256 = "{hash_token(t)}"\n' for name, t in TOKENS.items())
    path.write_text(
        f'[auth]\nadmin_token_sha256 = "{hash_token(ADMIN_TOKEN)}"\n\n'
        "[gateway]\nupstream_timeout_s = 60.0\n\n"
        f"[servers.everything]\n{server}\ntransparent = true\n\n{agents}{grants}"
    )
    return path


@contextlib.asynccontextmanager
async def http_exchange(
    http: httpx.AsyncClient, url: str, agent: str, *, version: str = VERSION
) -> AsyncIterator[Exchange]:
    """A transport session of ``agent`` (a name of ``TOKENS``, else a bearer token) with the gateway
    at ``version`` (2025-11-25 unless told), declaring the tasks capability."""
    ids = itertools.count(1)
    headers = {
        "authorization": f"Bearer {TOKENS.get(agent, agent)}",
        "accept": ACCEPT,
        "content-type": "application/json",
    }
    init = {
        "protocolVersion": version,
        "capabilities": {"tasks": TASKS_CAPABILITY},
        "clientInfo": {"name": "tasks-relay", "version": "0"},
    }
    opened = await http.post(
        url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
    )
    assert opened.status_code == 200, opened.text
    exchange_headers = {
        **headers,
        "mcp-session-id": opened.headers["mcp-session-id"],
        "mcp-protocol-version": version,
    }
    acked = await http.post(
        url, headers=exchange_headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
    )
    assert acked.status_code == 202, acked.text

    async def exchange(method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        response = await http.post(url, headers=exchange_headers, json=message)
        assert response.status_code == 200, (method, response.status_code, response.text)
        for answer in messages_of(response):
            if answer.get("id") == request_id:
                return answer
        raise AssertionError(f"no answer to {method}: {response.status_code} {response.text}")

    [initialized] = [m for m in messages_of(opened) if m.get("id") == 0]
    assert initialized["result"]["protocolVersion"] == version
    exchange.capabilities = initialized["result"]["capabilities"]  # type: ignore[attr-defined]
    exchange.headers = exchange_headers  # type: ignore[attr-defined]
    yield exchange


def task_call(execution_id: str) -> dict[str, Any]:
    name, arguments = RESEARCH
    return {
        "name": name,
        "arguments": arguments,
        "task": {"ttl": 60000},
        "_cmcp": {"execution_id": execution_id},
    }


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, *, upstream_url: str | None = None
) -> AsyncIterator[tuple[httpx.AsyncClient, str, int]]:
    """``bastion serve`` in front of server-everything (stdio, or at ``upstream_url``), data under
    ``tmp_path / "data"``."""
    config = write_config(tmp_path / "gateway.toml", url=upstream_url)
    async with (
        httpx.AsyncClient(timeout=60) as http,
        bastion_serve(config, tmp_path / "data", tmp_path / "gateway.log") as (process, url),
    ):
        yield http, url, process.pid


def rows(data_dir: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{data_dir / 'bastion.db'}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, args).fetchall()


def events_of(data_dir: Path, execution_id: str) -> list[str]:
    found = rows(data_dir, "SELECT entry FROM entries ORDER BY session_id, seq")
    return [
        entry["event"] for (raw,) in found if (entry := json.loads(raw)).get("execution_id") == execution_id
    ]


async def test_the_task_lifecycle_through_bastion_equals_direct(tmp_path: Path) -> None:
    """Create, poll, collect, list, cancel-when-done, unknown id: the same transcript as direct."""
    with anyio.fail_after(DEADLINE_S):
        async with stdio_exchange(npm_server("everything", "stdio")) as direct:
            expected = await lifecycle(direct, *RESEARCH)
        async with (
            serving(tmp_path) as (http, url, _),
            http_exchange(http, url, "alice") as relayed,
        ):
            assert relayed.capabilities["tasks"] == TASKS_CAPABILITY  # type: ignore[attr-defined]
            transcript = await lifecycle(relayed, *RESEARCH)
    assert transcript == expected


async def test_the_typescript_clients_task_api_sees_through_bastion_what_it_sees_direct(
    tmp_path: Path,
) -> None:
    """The TypeScript SDK's experimental task API (``tasks_client.mjs``: callToolStream, getTask,
    listTasks, cancelTask): the same report direct over stdio and through ``bastion serve``."""
    node = ts_node()
    command = npm_server("everything", "stdio")
    script = str(TS_CLIENT_DIR / "tasks_client.mjs")

    async def report(*args: str) -> dict[str, Any]:
        finished = await anyio.run_process([node, script, *args], cwd=TS_CLIENT_DIR, check=False)
        assert finished.returncode == 0, finished.stderr.decode()
        return dict(json.loads(finished.stdout.decode().strip().splitlines()[-1]))

    with anyio.fail_after(DEADLINE_S):
        direct = await report("stdio", *command)
        async with serving(tmp_path) as (_, url, _):
            through = await report("http", url, TOKENS["alice"])
    assert direct["stream"][0] == "taskCreated:working" and direct["content"] == ["text"]
    assert through == direct


async def test_the_task_lifecycle_through_bastion_to_an_http_upstream_equals_direct(
    tmp_path: Path, everything_url: str
) -> None:
    """server-everything over Streamable HTTP (session era): the same transcript through Bastion."""
    with anyio.fail_after(DEADLINE_S):
        async with (
            httpx.AsyncClient(timeout=60) as http,
            http_exchange(http, everything_url, "alice") as direct,
        ):
            expected = await lifecycle(direct, *RESEARCH)
        async with (
            serving(tmp_path, upstream_url=everything_url) as (http, url, _),
            http_exchange(http, url, "alice") as relayed,
        ):
            transcript = await lifecycle(relayed, *RESEARCH)
    assert transcript == expected


async def test_another_agents_task_id_is_an_unknown_id_and_a_task_settles_its_execution(
    tmp_path: Path,
) -> None:
    """Bob's probe of Alice's task id answers as a made-up id does; Alice's replay is the same task;
    the execution is invoking while the task works and completed when it completed."""
    data_dir, call = tmp_path / "data", task_call("exec-t1")
    with anyio.fail_after(DEADLINE_S):
        async with (
            serving(tmp_path) as (http, url, _),
            http_exchange(http, url, "alice") as alice,
            http_exchange(http, url, "bob") as bob,
        ):
            created = (await alice("tools/call", call))["result"]["task"]
            task_id = created["taskId"]
            assert task_id.startswith("task_")
            [(upstream_id, state)] = rows(
                data_dir,
                "SELECT t.upstream_task_id, e.state FROM tasks t JOIN executions e"
                " ON e.execution_id = t.execution_id WHERE t.task_id = ?",
                task_id,
            )
            assert upstream_id != task_id and state == "invoking"
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                probed = await bob(method, {"taskId": task_id})
                unknown = await bob(method, {"taskId": "task_" + "0" * 32})
                assert probed["error"] == unknown["error"], method
                assert probed["error"]["code"] == -32602
                # The upstream's own id is nobody's handle either.
                assert (await alice(method, {"taskId": upstream_id}))["error"] == unknown["error"]
            assert (await bob("tasks/list", {}))["result"]["tasks"] == []
            replayed = (await alice("tools/call", call))["result"]["task"]
            assert replayed["taskId"] == task_id
            result = (await alice("tasks/result", {"taskId": task_id}))["result"]
            assert [item["type"] for item in result["content"]] == ["text"]
            assert (await alice("tasks/get", {"taskId": task_id}))["result"]["status"] == "completed"
    assert rows(data_dir, "SELECT count(*) FROM tasks") == [(1,)]  # one creation, the replay made none
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-t1'") == [("completed",)]
    events = events_of(data_dir, "exec-t1")
    # The replay while the task works: refused as in flight (audited), answered with the same task.
    assert events[:4] == ["admitted", "invoking", "task_created", "refused"]
    assert "task_result" in events and events.count("completed") == 1


async def test_a_cancelled_task_ends_its_execution_outcome_unknown(tmp_path: Path) -> None:
    """tasks/cancel reaches the upstream; the task is cancelled, the execution outcome_unknown, audited."""
    data_dir, call = tmp_path / "data", task_call("exec-c1")
    with anyio.fail_after(DEADLINE_S):
        async with (
            serving(tmp_path) as (http, url, _),
            http_exchange(http, url, "alice") as alice,
        ):
            task_id = (await alice("tools/call", call))["result"]["task"]["taskId"]
            cancelled = (await alice("tasks/cancel", {"taskId": task_id}))["result"]
            assert (cancelled["taskId"], cancelled["status"]) == (task_id, "cancelled")
            assert (await alice("tasks/get", {"taskId": task_id}))["result"]["status"] == "cancelled"
            metrics = (await http.get(url.removesuffix("/mcp") + "/metrics")).text
    assert 'bastion_tasks_created_total{server="everything"} 1.0' in metrics
    assert 'bastion_tasks_terminal_total{server="everything",status="cancelled"} 1.0' in metrics
    assert 'bastion_requests_total{method="tasks/cancel",outcome="completed",reason=""} 1.0' in metrics
    assert rows(data_dir, "SELECT status FROM tasks") == [("cancelled",)]
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-c1'") == [
        ("outcome_unknown",)
    ]
    events = events_of(data_dir, "exec-c1")
    assert "task_cancel" in events and events.count("outcome_unknown") == 1


def children_running(parent: int, name: str) -> list[int]:
    """The pids of ``parent``'s child processes whose command line names ``name`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and name.encode() in (stat.parent / "cmdline").read_bytes():
                found.append(int(stat.parent.name))
    return found


async def test_a_task_whose_upstream_died_ends_its_execution_outcome_unknown(tmp_path: Path) -> None:
    """The upstream process that held a working task is killed: the next poll answers outcome_unknown,
    the task is recorded failed and its execution outcome_unknown, once; a replay makes no second task."""
    data_dir, call = tmp_path / "data", task_call("exec-l1")
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path) as (http, url, gateway_pid), http_exchange(http, url, "alice") as alice:
            task_id = (await alice("tools/call", call))["result"]["task"]["taskId"]
            killed = children_running(gateway_pid, "server-everything")
            assert len(killed) == 2, killed
            for pid in killed:
                os.kill(pid, signal.SIGKILL)  # the gateway's own children: the listing and alice's process
            # Until the loss is recorded: upstream_unavailable while the process restarts, or
            # outcome_unknown (a poll the dying process took, or the poll that found it lost).
            while rows(data_dir, "SELECT status FROM tasks") != [("failed",)]:
                answer = await alice("tasks/get", {"taskId": task_id})
                assert answer["error"]["code"] in (-32060, -32063), answer
                await anyio.sleep(0.1)
            assert (
                answer["error"]["code"] == -32063 and answer["error"]["data"]["reason"] == "outcome_unknown"
            )
            # Recorded lost: the upstream's own answer to an id it does not know, nothing recorded twice.
            assert (await alice("tasks/get", {"taskId": task_id}))["error"]["code"] == -32602
            replayed = await alice("tools/call", call)
            assert replayed["error"]["data"]["reason"] == "execution_replay", replayed
    assert rows(data_dir, "SELECT status FROM tasks") == [("failed",)]
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-l1'") == [
        ("outcome_unknown",)
    ]
    assert events_of(data_dir, "exec-l1").count("outcome_unknown") == 1


async def test_another_agent_session_of_the_same_agent_and_a_revoked_one_cannot_reach_a_task(
    tmp_path: Path,
) -> None:
    """A task belongs to the agent session that created it: the same agent's other session gets the
    unknown-id answer; once its own session is revoked, its credential reaches nothing."""
    call = task_call("exec-r1")
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path) as (http, url, _):
            origin = url.removesuffix("/mcp")
            first = await create_agent_session(http, origin, agent="alice")
            second = await create_agent_session(http, origin, agent="alice")
            async with (
                http_exchange(http, url, first.token) as owner,
                http_exchange(http, url, second.token) as other,
            ):
                task_id = (await owner("tools/call", call))["result"]["task"]["taskId"]
                unknown = await other("tasks/get", {"taskId": "task_" + "0" * 32})
                assert (await other("tasks/get", {"taskId": task_id}))["error"] == unknown["error"]
                assert (await other("tasks/list", {}))["result"]["tasks"] == []
                assert (await owner("tasks/get", {"taskId": task_id}))["result"]["taskId"] == task_id
                await revoke_agent_session(http, origin, first.agent_session_id)
                refused = await http.post(
                    url,
                    headers={"authorization": f"Bearer {first.token}", "accept": ACCEPT},
                    json={"jsonrpc": "2.0", "id": 9, "method": "tasks/get", "params": {"taskId": task_id}},
                )
                assert refused.status_code == 401, refused.text


async def test_a_task_whose_server_the_grants_no_longer_name_is_an_unknown_id(tmp_path: Path) -> None:
    """After a reload that takes alice's grant of the server away, her task id answers as a made-up
    one (with no tasks server left to her, the methods are not found at all)."""
    call = task_call("exec-g1")
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path) as (http, url, _):
            write_config(tmp_path / "gateway.toml", granted=("alice", "bob"))
            assert (await reload_policy(http, url.removesuffix("/mcp"))).status_code == 200
            async with http_exchange(http, url, "alice") as alice:
                task_id = (await alice("tools/call", call))["result"]["task"]["taskId"]
                assert (await alice("tasks/get", {"taskId": task_id}))["result"]["taskId"] == task_id
                write_config(tmp_path / "gateway.toml", granted=("bob",))
                assert (await reload_policy(http, url.removesuffix("/mcp"))).status_code == 200
                for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                    unknown = await alice(method, {"taskId": "task_" + "0" * 32})
                    assert (await alice(method, {"taskId": task_id}))["error"] == unknown["error"], method


async def test_tasks_methods_are_not_found_for_a_principal_no_tasks_server_is_visible_to(
    tmp_path: Path,
) -> None:
    """Grants that show bob no server: no tasks capability, tasks/* are -32601 (a server without tasks)."""
    config = write_config(tmp_path / "gateway.toml", granted=("alice",))
    with anyio.fail_after(DEADLINE_S):
        async with (
            httpx.AsyncClient(timeout=60) as http,
            bastion_serve(config, tmp_path / "data", tmp_path / "gateway.log") as (_, url),
            http_exchange(http, url, "bob") as bob,
            http_exchange(http, url, "alice") as alice,
        ):
            assert "tasks" not in bob.capabilities  # type: ignore[attr-defined]
            assert "tasks" in alice.capabilities  # type: ignore[attr-defined]
            for method in ("tasks/get", "tasks/list"):
                assert (await bob(method, {"taskId": "task_" + "0" * 32}))["error"]["code"] == -32601
            assert (await alice("tasks/get", {"taskId": "task_" + "0" * 32}))["error"]["code"] == -32602


async def test_tasks_are_announced_and_served_only_at_a_revision_that_has_them(tmp_path: Path) -> None:
    """At 2025-03-26 and 2025-06-18 (no tasks) initialize announces no tasks, tasks/* are -32601 and
    params.task is ignored (a task-required tool is refused task_required, nothing is created);
    at 2025-11-25 the same server's tasks are announced and served."""
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path) as (http, url, _):
            for version in HANDSHAKE_VERSIONS:
                async with http_exchange(http, url, "alice", version=version) as alice:
                    capabilities = alice.capabilities  # type: ignore[attr-defined]
                    if version in TASKS_VERSIONS:
                        assert capabilities["tasks"] == TASKS_CAPABILITY
                        assert "result" in await alice("tasks/list", {})
                        continue
                    assert "tasks" not in capabilities, version
                    for method in ("tasks/get", "tasks/result", "tasks/cancel", "tasks/list"):
                        answer = await alice(method, {"taskId": "task_" + "0" * 32})
                        assert answer["error"]["code"] == -32601, (version, method, answer)
                    refused = await alice("tools/call", task_call(f"old-{version}"))
                    assert refused["error"]["data"]["reason"] == "task_required", (version, refused)
    assert rows(tmp_path / "data", "SELECT count(*) FROM tasks") == [(0,)]
