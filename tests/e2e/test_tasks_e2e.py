"""Tasks the gateway does not relay (issue 24): no task is created through it unowned, none is dropped.

Relayed tasks (a session-era client, an upstream that declares task-augmented tool calls) are
tested in tests/e2e/test_tasks_relay_e2e.py. Here the upstream declares no tasks (the SDK fixture),
or the client cannot ask for one (the Python SDK client): a 2025-11-25 task augmentation is
ignored, as by any receiver that does not declare tasks, and
the call runs to its result; a tool that runs only as a task is refused by name (``TaskRequired``,
-32080) before admission and before any upstream is asked; a task the upstream starts anyway is
not relayed (``unrequested_task``) and its execution is ``outcome_unknown``. Upstreams: the SDK fixture
``tests/e2e/tasks_upstream.py`` and the TypeScript SDK's server-everything.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from mcp.shared.exceptions import MCPError

from bastion.admission.states import ExecutionState
from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.ids import AgentId, ExecutionId
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, RunningGateway
from tests.e2e.test_transport_rules import MODERN, MODERN_META, headers, open_session, rpc, session_headers
from tests.e2e.third_party.servers import npm_server
from tests.e2e.upstream_support import listening_upstream
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

MODES = ["legacy", "auto"]
TASK = {"ttl": 60000}


@contextlib.asynccontextmanager
async def _gateway(
    tmp_path: Path, *, everything: bool = False, servers: dict[str, Any] | None = None
) -> AsyncIterator[RunningGateway]:
    servers = servers or {"tasks": {"command": sys.executable, "args": ["-m", "tests.e2e.tasks_upstream"]}}
    if everything:
        command = npm_server("everything", "stdio")
        servers["ev"] = {"command": command[0], "args": command[1:]}
    config = {
        "servers": servers,
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    snapshot = snapshot_from_mapping(config, source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        yield RunningGateway(url, app.state.gateway, tmp_path)


def _entries(tmp_path: Path) -> list[dict[str, Any]]:
    uri = f"file:{tmp_path / 'data' / 'bastion.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute("SELECT entry FROM entries").fetchall()
    return [orjson.loads(row[0]) for row in rows]


def _text(body: dict[str, Any]) -> str:
    content = body["result"]["content"]
    assert isinstance(content, list) and content[0]["type"] == "text"
    text = content[0]["text"]
    assert isinstance(text, str)
    return text


async def test_a_task_augmentation_is_ignored_and_the_call_runs_to_its_result(tmp_path: Path) -> None:
    """params.task never reaches the upstream: both eras get the plain result and no task is made."""
    with anyio.fail_after(60):
        async with _gateway(tmp_path) as running, httpx.AsyncClient(timeout=30) as http:
            session_id = await open_session(http, running.url)
            session_call = await http.post(
                running.url,
                headers=session_headers(session_id),
                json=rpc("tools/call", {"name": "tasks__compute", "arguments": {}, "task": TASK}, 2),
            )
            modern = await http.post(
                running.url,
                headers=headers(
                    **{
                        "mcp-protocol-version": MODERN,
                        "mcp-method": "tools/call",
                        "mcp-name": "tasks__compute",
                    }
                ),
                json=rpc(
                    "tools/call",
                    {"name": "tasks__compute", "arguments": {}, "task": TASK, "_meta": MODERN_META},
                    3,
                ),
            )
            made = await http.post(
                running.url,
                headers=session_headers(session_id),
                json=rpc("tools/call", {"name": "tasks__tasks_made", "arguments": {}}, 4),
            )
    assert "task" not in session_call.json()["result"]
    assert _text(session_call.json()) == "computed"
    assert _text(modern.json()) == "computed"
    assert _text(made.json()) == "0"


@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_that_runs_only_as_a_task_is_refused_by_name(tmp_path: Path, mode: str) -> None:
    """taskSupport "required" is TaskRequired (-32080), audited, and nothing is admitted or sent."""
    with anyio.fail_after(60):
        async with _gateway(tmp_path, everything=True) as running, running.client(mode=mode) as client:
            refusals = []
            for name in ("tasks__research", "ev__simulate-research-query"):
                with pytest.raises(MCPError) as refused:
                    await client.call_tool(name, {"topic": "x"})
                refusals.append(refused.value.error)
            made = await client.call_tool("tasks__tasks_made", {})
    for error in refusals:
        assert error.code == -32080
        assert isinstance(error.data, dict) and error.data["reason"] == "task_required"
        assert "runs only as a task" in error.message
    assert made.content[0].text == "0"  # type: ignore[union-attr]
    entries = _entries(tmp_path)
    refused_entries = [e for e in entries if e.get("reason") == "task_required"]
    assert {e["tool"] for e in refused_entries} == {"research", "simulate-research-query"}
    assert all(e["event"] == "refused" and e["decision"] == "deny" for e in refused_entries)
    refused_calls = {e["call_id"] for e in refused_entries}
    assert not [e for e in entries if e["call_id"] in refused_calls and e["event"] != "refused"]


async def test_a_task_the_upstream_insists_on_is_refused_its_execution_outcome_unknown(
    tmp_path: Path,
) -> None:
    """A plain call answered with a 2026 task: a typed error, outcome_unknown, and a replay creates none."""
    params = {"name": "tasks__insists_2026", "arguments": {}, "_cmcp": {"execution_id": "ex-insists"}}
    with (
        listening_upstream([sys.executable, "-m", "tests.e2e.tasks_upstream", "--http"]) as upstream_url,
        anyio.fail_after(60),
    ):
        servers = {"tasks": {"url": upstream_url, "era": "sessionless"}}
        async with _gateway(tmp_path, servers=servers) as running, httpx.AsyncClient(timeout=30) as http:
            session_id = await open_session(http, running.url)
            call = session_headers(session_id)
            first = await http.post(running.url, headers=call, json=rpc("tools/call", params, 2))
            again = await http.post(running.url, headers=call, json=rpc("tools/call", params, 3))
            made = await http.post(
                running.url, headers=call, json=rpc("tools/call", {"name": "tasks__tasks_made"}, 4)
            )
            store = running.gateway.store
            assert store is not None
            record = await store.get_execution(AgentId("alice"), ExecutionId("ex-insists"))
    error = first.json()["error"]
    assert error["code"] == -32062
    assert error["data"]["reason"] == "upstream_protocol_error"
    assert error["data"]["problem"] == "unrequested_task"
    assert record is not None and record.state is ExecutionState.OUTCOME_UNKNOWN
    replay = again.json()["error"]["data"]
    assert replay["reason"] == "execution_replay" and replay["earlier_outcome"] == "outcome_unknown"
    assert _text(made.json()) == "1"  # the replay created no second task
