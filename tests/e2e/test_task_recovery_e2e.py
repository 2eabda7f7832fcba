"""A task outlives its gateway and its client's transport session (issue 24, DESIGN section 3).

The upstream is the conformance fixture, whose tasks live per process; Bastion runs in front of it
as ``bastion serve``. A gateway SIGKILLed while a task runs leaves the creating execution
``invoking``; the restarted gateway's recovery leaves it to its task (a ``recovery`` entry, reason
``task_live``), the same agent's next poll settles it ``completed``, and a replay of the creating
call is the same task, never a second. A session-era client that reconnects (a new transport
session, the same static-token agent) still reaches its task. With two replicas on PostgreSQL, a
task created at one and killed there is polled to completion at the other.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from tests.e2e.test_shared_evidence_crash import bastion_serve
from tests.e2e.test_tasks_extension_e2e import (
    asker,
    call,
    entries_of,
    fixture_upstream,
    rows,
    session_era,
    settled,
    write_config,
)
from tests.e2e.test_workers_e2e import gateway_process

pytestmark = pytest.mark.anyio

DEADLINE_S = 120
_TERMINAL = ("completed", "failed", "cancelled")


async def test_a_task_outlives_a_killed_gateway_and_settles_its_execution_after_restart(
    tmp_path: Path,
) -> None:
    """SIGKILL while the task runs; after the restart, recovery leaves the execution to its task, the
    agent's poll gets ``completed`` and settles it, and a replay answers the same task."""
    data_dir, log = tmp_path / "data", tmp_path / "gateway.log"
    creating = call("slow_compute", {"seconds": 5, "label": "survivor"}, "exec-k1")
    with anyio.fail_after(DEADLINE_S):
        async with fixture_upstream() as upstream_url, httpx.AsyncClient(timeout=30) as http:
            config = write_config(tmp_path / "gateway.toml", upstream_url)
            async with bastion_serve(config, data_dir, log) as (first, url):
                created = (await asker(http, url, "alice")("tools/call", creating))["result"]
                task_id = created["taskId"]
                first.send_signal(signal.SIGKILL)
                assert await first.wait() == -signal.SIGKILL
            assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-k1'") == [
                ("invoking",)
            ]
            async with bastion_serve(config, data_dir, log) as (_, url):
                # Recovered before it served: still the task's to settle.
                assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-k1'") == [
                    ("invoking",)
                ]
                alice = asker(http, url, "alice")
                replayed = (await alice("tools/call", creating))["result"]
                assert replayed["resultType"] == "task" and replayed["taskId"] == task_id
                done = await settled(alice, task_id)
                assert done["status"] == "completed" and done["result"]["content"], done
                again = (await alice("tools/call", creating))["result"]
                assert again["resultType"] == "task" and again["taskId"] == task_id
    assert rows(data_dir, "SELECT count(*) FROM tasks") == [(1,)]  # never run twice
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-k1'") == [("completed",)]
    entries = sorted(entries_of(data_dir, "exec-k1"), key=lambda entry: entry["ts"])  # over three chains
    events = [entry["event"] for entry in entries]
    assert events[:4] == ["admitted", "invoking", "task_created", "recovery"], events
    [left] = [entry for entry in entries if entry["event"] == "recovery"]
    assert (left["reason"], left["outcome"], left["detail"]["task_id"]) == ("task_live", None, task_id)
    assert left["detail"]["previous_state"] == "invoking" and left["detail"]["last_entry"] is not None
    [completed] = [entry for entry in entries if entry["event"] == "completed"]
    assert completed["detail"]["task_status"] == "completed" and completed["detail"]["result_digest"]
    assert "outcome_unknown" not in events


async def test_a_session_era_client_reaches_its_task_from_a_new_transport_session(tmp_path: Path) -> None:
    """Created in one transport session, which the client ends; a new session of the same
    static-token agent polls it to ``completed``; another agent's session does not find it."""
    data_dir, log = tmp_path / "data", tmp_path / "gateway.log"
    with anyio.fail_after(DEADLINE_S):
        async with fixture_upstream() as upstream_url, httpx.AsyncClient(timeout=30) as http:
            config = write_config(tmp_path / "gateway.toml", upstream_url)
            async with bastion_serve(config, data_dir, log) as (_, url):
                first, ask, _ = await session_era(http, url, "alice")
                created = await ask(
                    "tools/call", call("slow_compute", {"seconds": 2, "label": "r"}, "exec-r2")
                )
                task_id = created["result"]["taskId"]
                assert (await http.delete(url, headers=first)).status_code in (200, 204)
                second, ask, _ = await session_era(http, url, "alice")
                assert second["mcp-session-id"] != first["mcp-session-id"]
                _, bob, _ = await session_era(http, url, "bob")
                assert (await bob("tasks/get", {"taskId": task_id}))["error"]["code"] == -32602
                while (polled := (await ask("tasks/get", {"taskId": task_id}))["result"])[
                    "status"
                ] not in _TERMINAL:
                    await anyio.sleep(0.1)
                assert polled["status"] == "completed" and polled["result"]["content"], polled
    assert rows(data_dir, "SELECT state FROM executions WHERE execution_id = 'exec-r2'") == [("completed",)]


def _pg_rows(store_url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(store_url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(query.replace("?", "%s"), args).fetchall()]


async def test_a_task_created_at_a_killed_replica_is_polled_to_completion_at_another(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas on one PostgreSQL store: the task is created at A, A is SIGKILLed, B's polls get
    ``completed`` and settle the execution (of A's generation) under B's worker."""
    monkeypatch.setenv("BASTION_STORE", postgres_url)  # inherited by both bastion serve processes
    data_dir = tmp_path / "data"
    creating = call("slow_compute", {"seconds": 3, "label": "anywhere"}, "exec-p1")
    with anyio.fail_after(DEADLINE_S):
        async with (
            fixture_upstream() as upstream_url,
            httpx.AsyncClient(timeout=30) as http,
            contextlib.AsyncExitStack() as stack,
        ):
            config = write_config(tmp_path / "gateway.toml", upstream_url)
            a = await stack.enter_async_context(
                gateway_process(config, data_dir, "gateway-1", tmp_path / "replica-1.log")
            )
            b = await stack.enter_async_context(
                gateway_process(config, data_dir, "gateway-2", tmp_path / "replica-2.log")
            )
            created = (await asker(http, a.url, "alice")("tools/call", creating))["result"]
            task_id = created["taskId"]
            a.process.send_signal(signal.SIGKILL)
            await a.process.wait()
            done = await settled(asker(http, b.url, "alice"), task_id)
            assert done["status"] == "completed" and done["result"]["content"], done
            again = (await asker(http, b.url, "alice")("tools/call", creating))["result"]
            assert again["resultType"] == "task" and again["taskId"] == task_id
    assert _pg_rows(postgres_url, "SELECT count(*) FROM tasks") == [(1,)]
    [(state, generation, worker)] = _pg_rows(
        postgres_url, "SELECT state, generation, worker FROM executions WHERE execution_id = 'exec-p1'"
    )
    assert (state, generation) == ("completed", "gateway-1")
    [(worker_generation,)] = _pg_rows(
        postgres_url, "SELECT generation FROM workers WHERE worker_id = ?", worker
    )
    assert worker_generation == "gateway-2"
