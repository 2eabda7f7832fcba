"""The 2026 tasks extension (SEP-2663) through a real ``bastion serve`` (issue 24).

The upstream is the conformance fixture (``tests/fixtures/conformance_server.py``), which serves
the extension completely in both eras; Bastion is configured in front of it as a user would, with
two agents, the upstream era negotiated or pinned to the session era. A sessionless client that
negotiates the extension per request gets the task under a gateway id; the other agent's probe
of that id, the upstream's own id and a made-up id are one answer; the execution that created the
task is invoking while it works and settled (with its audit entries) when a poll sees it end; a
replay is the same task, never a second; ``tasks/update`` and ``tasks/cancel`` reach the owner's
task only; without the extension the task methods and a required-task tool answer -32021, as
the server itself does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.auth.bearer import hash_token
from bastion.tasks.support import TASKS_EXTENSION
from tests.e2e.issue4_support import ADMIN_TOKEN, reload_policy
from tests.e2e.test_shared_evidence_crash import bastion_serve

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
TOKENS = {"alice": "alice-extension-token", "bob": "bob-extension-token"}
DEADLINE_S = 60
_OPT_IN = {"extensions": {TASKS_EXTENSION: {}}}
_UNKNOWN_ID = "task_" + "0" * 32

Ask = Callable[..., Awaitable[dict[str, Any]]]


@contextlib.asynccontextmanager
async def fixture_upstream() -> AsyncIterator[str]:
    """The conformance fixture as a subprocess; yields its URL."""
    process = await anyio.open_process(
        [sys.executable, "-m", "tests.fixtures.conformance_server", "--port", "0"],
        stderr=None,
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
        words = line.decode().split()
        assert words[0] == "LISTENING", line
        yield words[1]
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


def write_config(
    path: Path, upstream_url: str, era: str = "auto", tools: dict[str, list[str]] | None = None
) -> Path:
    """The gateway's file: the fixture as a transparent server, alice and bob granted ``tools`` of
    it (every tool unless told), an admin token for reloads."""
    tools = tools or {name: ["*"] for name in TOKENS}
    agents = "".join(f'[agents.{name}]\ntoken_sha256 = "{hash_token(t)}"\n' for name, t in TOKENS.items())
    grants = "".join(
        f'[[grants]]\nagent = "{name}"\nservers = ["fixture"]\ntools = {json.dumps(granted)}\n'
        for name, granted in tools.items()
    )
    path.write_text(
        f'[auth]\nadmin_token_sha256 = "{hash_token(ADMIN_TOKEN)}"\n\n'
        "[gateway]\nupstream_timeout_s = 30.0\n\n"
        f'[servers.fixture]\nurl = "{upstream_url}"\ntransparent = true\nera = "{era}"\n\n'
        f"{agents}{grants}"
    )
    return path


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, era: str, tools: dict[str, list[str]] | None = None
) -> AsyncIterator[tuple[str, Path]]:
    """``bastion serve`` in front of the fixture (upstream era ``era``); yields its URL and data dir.
    ``tmp_path / "upstream_url"`` holds the fixture's URL (to write the file again for a reload)."""
    config = tmp_path / "gateway.toml"
    async with fixture_upstream() as upstream_url:
        (tmp_path / "upstream_url").write_text(upstream_url)
        write_config(config, upstream_url, era, tools)
        data_dir = tmp_path / "data"
        async with bastion_serve(config, data_dir, tmp_path / "gateway.log") as (_, url):
            yield url, data_dir


def asker(http: httpx.AsyncClient, url: str, agent: str) -> Ask:
    """Raw 2026-07-28 requests of ``agent``: ``ask(method, params, opt_in=True, headers=None)`` answers
    the JSON-RPC message (result or error); ``opt_in`` negotiates the extension for that request;
    ``status``, when given, is the HTTP status it must come with."""
    ids = itertools.count(1)

    async def ask(
        method: str,
        params: dict[str, Any],
        *,
        opt_in: bool = True,
        headers: dict[str, str] | None = None,
        status: int | None = None,
    ) -> dict[str, Any]:
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": _OPT_IN if opt_in else {},
        }
        sent = {**params, "_meta": {**meta, **params.get("_meta", {})}}
        name = params.get("taskId") if method.startswith("tasks/") else params.get("name")
        request_headers = {
            "authorization": f"Bearer {TOKENS[agent]}",
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": MODERN,
            "mcp-method": method,
            **({"mcp-name": name} if isinstance(name, str) else {}),
            **(headers or {}),
        }
        body = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": sent}
        response = await http.post(url, headers=request_headers, json=body)
        if status is not None:
            assert response.status_code == status, (method, response.status_code, response.text)
        text = response.text
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            text = [line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip()][
                -1
            ]
        answer: dict[str, Any] = json.loads(text)
        return answer

    return ask


async def session_era(
    http: httpx.AsyncClient, url: str, agent: str, capabilities: dict[str, Any] | None = None
) -> tuple[dict[str, str], Ask, dict[str, Any]]:
    """A 2025-11-25 transport session of ``agent`` declaring ``capabilities`` (the tasks extension
    unless told) at ``initialize``: its headers, ``ask(method, params)`` (the JSON-RPC answer) and
    the capabilities the gateway announced."""
    version = "2025-11-25"
    headers = {
        "authorization": f"Bearer {TOKENS[agent]}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
    }
    init = {
        "protocolVersion": version,
        "capabilities": _OPT_IN if capabilities is None else capabilities,
        "clientInfo": {"name": "t", "version": "0"},
    }
    opened = await http.post(
        url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
    )
    assert opened.status_code == 200, opened.text
    headers |= {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": version}
    acked = await http.post(
        url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
    )
    assert acked.status_code == 202, acked.text
    ids = itertools.count(1)

    async def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}
        answer: dict[str, Any] = (await http.post(url, headers=headers, json=message)).json()
        return answer

    announced: dict[str, Any] = opened.json()["result"]["capabilities"]
    return headers, ask, announced


def rows(data_dir: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{data_dir / 'bastion.db'}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, args).fetchall()


def entries_of(data_dir: Path, execution_id: str) -> list[dict[str, Any]]:
    found = rows(data_dir, "SELECT entry FROM entries ORDER BY session_id, seq")
    return [entry for (raw,) in found if (entry := json.loads(raw)).get("execution_id") == execution_id]


async def settled(
    ask: Ask, task_id: str, *, until: tuple[str, ...] = ("completed", "failed", "cancelled")
) -> dict[str, Any]:
    """``tasks/get`` until the task's status is one of ``until``."""
    while True:
        answer = await ask("tasks/get", {"taskId": task_id})
        task: dict[str, Any] = answer["result"]
        if task["status"] in until:
            return task
        await anyio.sleep(0.1)


def call(name: str, arguments: dict[str, Any], execution_id: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if execution_id is not None:
        params["_cmcp"] = {"execution_id": execution_id}
    return params


@pytest.mark.parametrize("era", ["auto", "session"])
async def test_a_task_is_its_owners_alone_and_settles_its_execution(tmp_path: Path, era: str) -> None:
    """Created under a gateway id; Bob's probes, the upstream's id and a made-up id are one answer;
    the replay is the same task; the execution completes when a poll sees the task complete."""
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path, era) as (url, data_dir), httpx.AsyncClient(timeout=30) as http:
            alice, bob = asker(http, url, "alice"), asker(http, url, "bob")
            discovered = (await alice("server/discover", {}))["result"]["capabilities"]
            assert TASKS_EXTENSION in discovered["extensions"] and "tasks" not in discovered
            creating = call("slow_compute", {"seconds": 1, "label": "owned"}, "exec-x1")
            created = (await alice("tools/call", creating))["result"]
            assert created["resultType"] == "task" and "task" not in created
            task_id = created["taskId"]
            assert task_id.startswith("task_") and isinstance(created["ttlMs"], int)
            [(upstream_id, state)] = rows(
                data_dir,
                "SELECT t.upstream_task_id, e.state FROM tasks t JOIN executions e"
                " ON e.execution_id = t.execution_id WHERE t.task_id = ?",
                task_id,
            )
            assert upstream_id != task_id and state == "invoking"
            for method, extra in (
                ("tasks/get", {}),
                ("tasks/update", {"inputResponses": {}}),
                ("tasks/cancel", {}),
            ):
                unknown = await bob(method, {"taskId": _UNKNOWN_ID, **extra})
                assert unknown["error"]["code"] == -32602, method
                assert (await bob(method, {"taskId": task_id, **extra}))["error"] == unknown["error"]
                assert (await alice(method, {"taskId": upstream_id, **extra}))["error"] == unknown["error"]
            replayed = (await alice("tools/call", creating))["result"]
            assert replayed["resultType"] == "task" and replayed["taskId"] == task_id
            done = await settled(alice, task_id)
            assert done["status"] == "completed" and done["taskId"] == task_id
            assert done["result"]["content"], done
    assert rows(data_dir, "SELECT count(*) FROM tasks") == [(1,)]  # the replay made none
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-x1'") == [("completed",)]
    entries = entries_of(data_dir, "exec-x1")
    events = [entry["event"] for entry in entries]
    assert events[:4] == ["admitted", "invoking", "task_created", "refused"]
    [completed] = [entry for entry in entries if entry["event"] == "completed"]
    assert completed["detail"]["task_status"] == "completed" and completed["detail"]["result_digest"]


async def test_update_and_cancel_reach_the_owners_task_and_are_audited(tmp_path: Path) -> None:
    """A task waiting for input shows its requests; ``tasks/update`` answers them (acknowledged,
    audited by digest) and the task completes; a cancelled task ends its execution outcome_unknown."""
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path, "auto") as (url, data_dir), httpx.AsyncClient(timeout=30) as http:
            alice = asker(http, url, "alice")
            asked = (await alice("tools/call", call("confirm_delete", {}, "exec-u1")))["result"]
            waiting = await settled(alice, asked["taskId"], until=("input_required",))
            keys = list(waiting["inputRequests"])
            assert keys and all(waiting["inputRequests"][k]["method"] == "elicitation/create" for k in keys)
            responses = {key: {"action": "accept", "content": {"confirm": True}} for key in keys}
            acked = await alice("tasks/update", {"taskId": asked["taskId"], "inputResponses": responses})
            assert acked["result"] == {"resultType": "complete"}
            assert (await settled(alice, asked["taskId"]))["status"] == "completed"

            long = await alice("tools/call", call("slow_compute", {"seconds": 60, "label": "c"}, "exec-c1"))
            cancel = await alice("tasks/cancel", {"taskId": long["result"]["taskId"]})
            assert cancel["result"] == {"resultType": "complete"}
            assert (await settled(alice, long["result"]["taskId"]))["status"] == "cancelled"
    assert "task_update" in [entry["event"] for entry in entries_of(data_dir, "exec-u1")]
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-c1'") == [
        ("outcome_unknown",)
    ]
    cancelled = [entry["event"] for entry in entries_of(data_dir, "exec-c1")]
    assert "task_cancel" in cancelled and cancelled[-1] == "outcome_unknown"


async def test_without_the_extension_the_task_surface_answers_as_the_server_does(tmp_path: Path) -> None:
    """-32021 naming the extension for tasks/get, update, cancel and a required-task tool; a plain
    call of a task-supporting tool runs synchronously; tasks/result and tasks/list do not exist;
    a Mcp-Name that is not the body's task id is a header mismatch."""
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path, "auto") as (url, data_dir), httpx.AsyncClient(timeout=30) as http:
            alice = asker(http, url, "alice")
            required = {"extensions": {TASKS_EXTENSION: {}}}
            for method, extra in (
                ("tasks/get", {}),
                ("tasks/update", {"inputResponses": {}}),
                ("tasks/cancel", {}),
            ):
                refused = await alice(method, {"taskId": "gate", **extra}, opt_in=False, status=400)
                assert refused["error"]["code"] == -32021, method
                assert refused["error"]["data"]["requiredCapabilities"] == required
            plain = await alice(
                "tools/call", call("slow_compute", {"seconds": 0, "label": "p"}), opt_in=False
            )
            assert plain["result"]["resultType"] == "complete" and "taskId" not in plain["result"]
            insisting = await alice("tools/call", call("failing_job", {}, "exec-r1"), opt_in=False)
            assert insisting["error"]["code"] == -32021
            assert insisting["error"]["data"]["requiredCapabilities"] == required
            for method in ("tasks/result", "tasks/list"):
                gone = await alice(method, {"taskId": "x"} if method == "tasks/result" else {}, status=404)
                assert gone["error"]["code"] == -32601, method
            created = (await alice("tools/call", call("slow_compute", {"seconds": 0.2, "label": "h"})))[
                "result"
            ]
            mismatched = await alice(
                "tasks/get", {"taskId": created["taskId"]}, headers={"mcp-name": "another"}, status=400
            )
            assert mismatched["error"]["code"] == -32020
    [refusal] = [entry for entry in entries_of(data_dir, "exec-r1")]
    assert refusal["event"] == "refused" and refusal["reason"] == "task_required"


async def test_a_session_era_client_that_declared_the_extension_is_served_its_tasks(tmp_path: Path) -> None:
    """A 2025-11-25 client that declares the extension at ``initialize``: told of it, its call of a
    task-supporting tool is a task of the extension's wire, polled to its end; ``tasks/list`` (no
    server offers 2025-11-25 tasks) does not exist."""
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path, "auto") as (url, data_dir), httpx.AsyncClient(timeout=30) as http:
            _, ask, capabilities = await session_era(http, url, "alice")
            assert TASKS_EXTENSION in capabilities["extensions"] and "tasks" not in capabilities
            created = await ask("tools/call", call("slow_compute", {"seconds": 0.5, "label": "s"}, "exec-s1"))
            assert created["result"]["resultType"] == "task" and created["result"]["taskId"].startswith(
                "task_"
            )
            while (polled := await ask("tasks/get", {"taskId": created["result"]["taskId"]}))["result"][
                "status"
            ] not in ("completed", "failed", "cancelled"):
                await anyio.sleep(0.1)
            assert polled["result"]["status"] == "completed" and polled["result"]["result"]["content"]
            assert (await ask("tasks/list", {}))["error"]["code"] == -32601
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-s1'") == [("completed",)]


async def test_a_task_whose_tool_the_grants_no_longer_cover_is_an_unknown_id(tmp_path: Path) -> None:
    """A reload that keeps alice's grant of the server but no longer covers the task's tool: her task
    id answers as a made-up one does, for every task method."""
    granted = {"alice": ["slow_compute", "greet"], "bob": ["*"]}
    with anyio.fail_after(DEADLINE_S):
        async with serving(tmp_path, "auto", granted) as (url, _), httpx.AsyncClient(timeout=30) as http:
            alice = asker(http, url, "alice")
            created = (await alice("tools/call", call("slow_compute", {"seconds": 30, "label": "g"})))[
                "result"
            ]
            task_id = created["taskId"]
            assert (await alice("tasks/get", {"taskId": task_id}))["result"]["taskId"] == task_id
            upstream_url = (tmp_path / "upstream_url").read_text()
            write_config(tmp_path / "gateway.toml", upstream_url, "auto", {"alice": ["greet"], "bob": ["*"]})
            assert (await reload_policy(http, url.removesuffix("/mcp"))).status_code == 200
            for method, extra in (
                ("tasks/get", {}),
                ("tasks/update", {"inputResponses": {}}),
                ("tasks/cancel", {}),
            ):
                unknown = await alice(method, {"taskId": _UNKNOWN_ID, **extra})
                assert unknown["error"]["code"] == -32602, method
                assert (await alice(method, {"taskId": task_id, **extra}))["error"] == unknown["error"], (
                    method
                )
