"""``notifications/tasks/status`` through a real ``bastion serve`` (issue 24), against server-everything.

server-everything pushes a status at each stage of ``simulate-research-query`` and at its end
(the TypeScript SDK's ``RequestTaskStore.updateTaskStatus`` / ``storeTaskResult``), with no request
link: on the session's GET stream over Streamable HTTP, on stdout over stdio. Through the gateway
each client's GET stream hears the statuses of its own task only, under the gateway's id, as a
client direct hears them; the terminal one settles the task and its execution before any poll.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.tasks_lifecycle import Exchange
from tests.e2e.test_capability_views_e2e import everything_url
from tests.e2e.test_tasks_relay_e2e import (
    DEADLINE_S,
    events_of,
    http_exchange,
    rows,
    serving,
    task_call,
)

pytestmark = pytest.mark.anyio

__all__ = ["everything_url"]  # the fixture, used by name

TERMINAL = ("completed", "failed", "cancelled")


async def statuses_of_one_task(
    http: httpx.AsyncClient, url: str, exchange: Exchange, key: str
) -> dict[str, Any]:
    """Open ``exchange``'s GET stream, create one research task, and collect the task statuses the
    stream brings until a terminal one: the created task id and each status as ``(taskId, status,
    statusMessage)``."""
    headers = {**exchange.headers, "accept": "text/event-stream"}  # type: ignore[attr-defined]
    heard: list[tuple[str, str, str | None]] = []
    listening = anyio.Event()

    async def listen() -> None:
        async with http.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            listening.set()
            async for line in response.aiter_lines():
                if not line.startswith("data:") or not line[5:].strip():
                    continue
                message = json.loads(line[5:])
                if message.get("method") != "notifications/tasks/status":
                    continue
                params = message["params"]
                heard.append((params["taskId"], params["status"], params.get("statusMessage")))
                if params["status"] in TERMINAL:
                    return

    async with anyio.create_task_group() as group:
        group.start_soon(listen)
        await listening.wait()
        # A plain call first, so the client's own upstream session (and the GET stream the gateway
        # follows on it) is open before the task's first status is sent.
        assert "result" in await exchange("tools/call", {"name": "echo", "arguments": {"message": "hi"}})
        created = await exchange("tools/call", task_call(key))
        task_id = created["result"]["task"]["taskId"]
    return {"task_id": task_id, "heard": heard}


def shape(observed: dict[str, Any]) -> list[tuple[str, str | None]]:
    """The statuses heard, each checked to name the task that was created."""
    assert {task_id for task_id, _, _ in observed["heard"]} == {observed["task_id"]}, observed
    return [(status, message) for _, status, message in observed["heard"]]


async def direct_statuses(http: httpx.AsyncClient, everything: str) -> list[tuple[str, str | None]]:
    async with http_exchange(http, everything, "alice") as direct:
        return shape(await statuses_of_one_task(http, everything, direct, "direct"))


@pytest.mark.parametrize("upstream", ["stdio", "http"])
async def test_each_client_hears_its_own_tasks_statuses_under_the_gateways_id_as_direct(
    tmp_path: Path, everything_url: str, upstream: str
) -> None:
    """Two agents run a task each at once: each GET stream hears only its own task's statuses, under
    the gateway's id, all that a direct client hears (the first, pushed before the gateway has
    recorded the task, included); the terminal one has settled task and execution already."""
    with anyio.fail_after(DEADLINE_S):
        async with httpx.AsyncClient(timeout=60) as http:
            expected = await direct_statuses(http, everything_url)
        assert expected[-1][0] == "completed" and len(expected) >= 4, expected
        observed: dict[str, dict[str, Any]] = {}
        data_dir = tmp_path / "data"
        async with (
            serving(tmp_path, upstream_url=everything_url if upstream == "http" else None) as (http, url, _),
            http_exchange(http, url, "alice") as alice,
            http_exchange(http, url, "bob") as bob,
        ):

            async def run(agent: str, exchange: Exchange) -> None:
                observed[agent] = await statuses_of_one_task(http, url, exchange, f"status-{agent}")
                # Settled by the notification itself: nobody has polled.
                assert rows(
                    data_dir,
                    "SELECT t.status, e.state FROM tasks t JOIN executions e"
                    " ON e.agent = t.agent AND e.execution_id = t.execution_id WHERE t.task_id = ?",
                    observed[agent]["task_id"],
                ) == [("completed", "completed")]

            async with anyio.create_task_group() as group:
                group.start_soon(run, "alice", alice)
                group.start_soon(run, "bob", bob)
    for agent in ("alice", "bob"):
        relayed = shape(observed[agent])
        assert observed[agent]["task_id"].startswith("task_")
        assert relayed == expected, (agent, relayed, expected)
        events = events_of(data_dir, f"status-{agent}")
        assert events[-1] == "completed" and "task_created" in events, events
