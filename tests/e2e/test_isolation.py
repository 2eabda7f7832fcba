"""Isolation under concurrency (DESIGN section 5), with raw HTTP so every client uses the SAME ids and tokens.

32 session-era clients and 8 sessionless clients run at once. Every client
uses JSON-RPC id 7 for a slow call and id 8 for an echo, and progress token
"tok". Step counts differ per client, so a progress notification delivered
to the wrong client would show as a wrong count or total. A seeded subset of
clients cancels its slow call after the first progress; every other slow call
must still finish.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.conftest import TOKENS, RunningGateway
from tests.e2e.test_transport_rules import INIT, MODERN, MODERN_META, headers, rpc

pytestmark = pytest.mark.anyio


@dataclass
class Outcome:
    progress: list[tuple[float, float]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    echo: str | None = None


async def post_sse(
    http: httpx.AsyncClient, url: str, request_headers: dict[str, str], body: dict[str, Any], on_message: Any
) -> None:
    """POST one request and feed every message of its answer (JSON or SSE) to ``on_message``."""
    async with http.stream("POST", url, headers=request_headers, json=body) as response:
        assert response.status_code == 200, await response.aread()
        if response.headers["content-type"].startswith("application/json"):
            await on_message(json.loads(await response.aread()))
            return
        data: list[str] = []
        async for line in response.aiter_lines():
            if line.startswith("data:") and line[5:].strip():  # a priming event has empty data
                data.append(line[5:].strip())
            elif line == "" and data:
                await on_message(json.loads("\n".join(data)))
                data = []


async def session_era_client(
    http: httpx.AsyncClient,
    url: str,
    index: int,
    tool: str,
    steps: int,
    cancel: bool,
    outcomes: dict[int, Outcome],
) -> None:
    agent = "alice" if index % 2 else "bob"
    init = await http.post(url, headers=headers(agent), json=INIT)
    session_id = init.headers["mcp-session-id"]
    session_headers = headers(agent, **{"mcp-session-id": session_id, "mcp-protocol-version": "2025-06-18"})
    await http.post(url, headers=session_headers, json=rpc("notifications/initialized", request_id=None))
    outcome = outcomes[index] = Outcome()
    first_progress = anyio.Event()

    async def on_slow(message: dict[str, Any]) -> None:
        if message.get("method") == "notifications/progress":
            params = message["params"]
            assert params["progressToken"] == "tok"
            outcome.progress.append((params["progress"], params["total"]))
            first_progress.set()
        elif message.get("id") is not None:
            assert message["id"] == 7
            outcome.result = message

    async def on_echo(message: dict[str, Any]) -> None:
        assert message["id"] == 8
        outcome.echo = message["result"]["content"][0]["text"]

    seconds = 8.0 if cancel else 0.6  # a cancelled call must still be running when the cancel lands
    slow = rpc(
        "tools/call",
        {"name": tool, "arguments": {"seconds": seconds, "steps": steps}, "_meta": {"progressToken": "tok"}},
        7,
    )
    echo = rpc("tools/call", {"name": "tools__echo", "arguments": {"text": f"client-{index}"}}, 8)
    async with anyio.create_task_group() as tg:
        tg.start_soon(post_sse, http, url, session_headers, slow, on_slow)
        await first_progress.wait()
        await post_sse(http, url, session_headers, echo, on_echo)
        if cancel:
            cancelled = rpc("notifications/cancelled", {"requestId": 7, "reason": "test"}, request_id=None)
            response = await http.post(url, headers=session_headers, json=cancelled)
            assert response.status_code == 202


async def sessionless_client(
    http: httpx.AsyncClient, url: str, index: int, steps: int, outcomes: dict[int, Outcome]
) -> None:
    outcome = outcomes[index] = Outcome()
    request_headers = headers(
        "alice", **{"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "tools__slow"}
    )

    async def on_message(message: dict[str, Any]) -> None:
        if message.get("method") == "notifications/progress":
            assert message["params"]["progressToken"] == "tok"
            outcome.progress.append((message["params"]["progress"], message["params"]["total"]))
        elif message.get("id") is not None:
            outcome.result = message

    body = rpc(
        "tools/call",
        {
            "name": "tools__slow",
            "arguments": {"seconds": 0.6, "steps": steps},
            "_meta": {**MODERN_META, "progressToken": "tok"},
        },
        7,
    )
    await post_sse(http, url, request_headers, body, on_message)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_concurrent_clients_never_see_each_other(running_gateway: RunningGateway, seed: int) -> None:
    """Same ids, same tokens, 40 clients: every message reaches exactly the client that asked."""
    rng = random.Random(seed)
    url = running_gateway.url
    plan = []
    for index in range(32):
        tool = "tools__slow" if index % 2 else "notes__slow"
        plan.append((index, tool, rng.randint(2, 5), rng.random() < 0.25))
    modern_plan = [(100 + i, rng.randint(2, 5)) for i in range(8)]
    outcomes: dict[int, Outcome] = {}
    # Idle connections are dropped before the server's 5 s keep-alive could close one under a request.
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100, keepalive_expiry=1.0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for index, tool, steps, cancel in plan:
                    tg.start_soon(session_era_client, http, url, index, tool, steps, cancel, outcomes)
                for index, steps in modern_plan:
                    tg.start_soon(sessionless_client, http, url, index, steps, outcomes)

    for index, _tool, steps, cancel in plan:
        outcome = outcomes[index]
        assert outcome.echo == f"client-{index}", index
        assert outcome.progress, index
        assert all(total == steps for _, total in outcome.progress), (index, outcome.progress)
        assert [p for p, _ in outcome.progress] == [float(n) for n in range(1, len(outcome.progress) + 1)]
        if cancel:
            assert outcome.result is None, index  # no response for a cancelled request
        else:
            assert outcome.result is not None and outcome.result["result"]["content"][0]["text"] == "done", (
                index
            )
            assert len(outcome.progress) == steps
    for index, steps in modern_plan:
        outcome = outcomes[index]
        assert outcome.progress == [(float(n), float(steps)) for n in range(1, steps + 1)], index
        assert outcome.result is not None and outcome.result["result"]["content"][0]["text"] == "done"
    # Nothing is left in flight once every client is done.
    with anyio.fail_after(10):
        while any(s.in_flight for s in running_gateway.gateway.registry):
            await anyio.sleep(0.02)
    assert all(s.agent in TOKENS for s in running_gateway.gateway.registry)
