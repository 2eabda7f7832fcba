"""Client resumability (issue 8 point 7): SSE event ids, and Last-Event-ID replay per session, exactly."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.conftest import RunningGateway
from tests.e2e.test_transport_rules import assert_error, headers, open_session, rpc, session_headers

pytestmark = pytest.mark.anyio

SLOW_CALL = rpc(
    "tools/call",
    {"name": "tools__slow", "arguments": {"seconds": 1.0, "steps": 4}, "_meta": {"progressToken": "p"}},
    request_id=5,
)


PRIMING = "2025-11-25"  # the first revision whose streams open with a priming event (SEP-1699)


async def _open_priming_session(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    """A 2025-11-25 session; the headers its requests carry."""
    init = {"protocolVersion": PRIMING, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    response = await http.post(url, headers=headers("alice"), json=rpc("initialize", init))
    assert response.json()["result"]["protocolVersion"] == PRIMING
    session = session_headers(response.headers["mcp-session-id"], version=PRIMING)
    ack = await http.post(url, headers=session, json=rpc("notifications/initialized", request_id=None))
    assert ack.status_code == 202
    return session


def _events(lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(id, message) for each SSE event in ``lines``."""
    events: list[tuple[str, dict[str, Any]]] = []
    event_id = ""
    for line in lines:
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:") and line[5:].strip():  # a priming event has empty data
            events.append((event_id, json.loads(line[5:])))
    return events


async def _first_event_then_drop(
    http: httpx.AsyncClient, url: str, session_id: str
) -> tuple[str, dict[str, Any]]:
    """POST the slow call, read its first SSE event, and close the connection under it."""
    lines: list[str] = []
    async with http.stream("POST", url, headers=session_headers(session_id), json=SLOW_CALL) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            lines.append(line)
            if _events(lines):
                break
    return _events(lines)[0]


async def _message_ids(
    response: httpx.Response, count: int, first_lines: list[str] | None = None
) -> list[str]:
    """The ids of the first ``count`` message events of ``response`` (priming events have no data)."""
    ids: list[str] = []
    event_id = ""
    async for line in response.aiter_lines():
        if first_lines is not None and len(first_lines) < 4:
            first_lines.append(line)
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:") and line[5:].strip():
            ids.append(event_id)
            if len(ids) == count:
                break
    return ids


async def _get_lines(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> list[str]:
    lines: list[str] = []
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            lines.append(line)
    return lines


async def test_a_dropped_response_stream_resumes_with_exactly_the_missed_events(
    running_gateway: RunningGateway,
) -> None:
    """After a drop, GET with Last-Event-ID gets each later event of that POST stream, then the answer."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        with anyio.fail_after(20):
            first_id, first = await _first_event_then_drop(http, running_gateway.url, session_id)
            resume = {**session_headers(session_id), "accept": "text/event-stream", "last-event-id": first_id}
            replayed = _events(await _get_lines(http, running_gateway.url, resume))
    assert first["method"] == "notifications/progress"
    stream_key, _, number = first_id.rpartition("-")
    ids = [event_id for event_id, _ in replayed]
    # Consecutive ids on that stream, right after the last one received: nothing lost, nothing twice.
    assert ids == [f"{stream_key}-{n}" for n in range(int(number) + 1, int(number) + 1 + len(ids))]
    progress = [m["params"]["progress"] for _, m in replayed if m.get("method") == "notifications/progress"]
    assert [first["params"]["progress"], *progress] == [1, 2, 3, 4]
    assert replayed[-1][1]["id"] == 5
    assert replayed[-1][1]["result"]["content"][0]["text"] == "done"


async def test_a_post_stream_opens_with_a_priming_event_that_resumes_everything(
    running_gateway: RunningGateway,
) -> None:
    """An SSE answer opens with an id, a retry hint and no data; resuming from it replays every message."""
    async with running_gateway.raw() as http:
        session = await _open_priming_session(http, running_gateway.url)
        opening: list[str] = []
        with anyio.fail_after(20):
            async with http.stream("POST", running_gateway.url, headers=session, json=SLOW_CALL) as response:
                async for line in response.aiter_lines():
                    opening.append(line)
                    if not line:
                        break  # dropped before any message
            resume = {
                **session,
                "accept": "text/event-stream",
                "last-event-id": opening[0].removeprefix("id: "),
            }
            replayed = _events(await _get_lines(http, running_gateway.url, resume))
    assert opening[0].startswith("id: ") and opening[1:] == ["retry: 1000", "data: ", ""]
    progress = [m["params"]["progress"] for _, m in replayed if m.get("method") == "notifications/progress"]
    assert progress == [1, 2, 3, 4]
    assert replayed[-1][1]["id"] == 5


async def test_another_sessions_event_id_replays_nothing(running_gateway: RunningGateway) -> None:
    """Session B presenting session A's event id is refused like an unknown id, and nothing of A's is sent."""
    async with running_gateway.raw() as http:
        session_a = await open_session(http, running_gateway.url)
        session_b = await open_session(http, running_gateway.url, agent="alice")
        with anyio.fail_after(20):
            a_id, _ = await _first_event_then_drop(http, running_gateway.url, session_a)
        b_get = {**session_headers(session_b), "accept": "text/event-stream"}
        foreign = await http.get(running_gateway.url, headers={**b_get, "last-event-id": a_id})
        unknown = await http.get(running_gateway.url, headers={**b_get, "last-event-id": "feedface-1"})
        malformed = await http.get(running_gateway.url, headers={**b_get, "last-event-id": "nonsense"})
        with anyio.fail_after(20):
            # A's own resume still works, so the refusal above was about B, not a spent id.
            a_get = {**session_headers(session_a), "accept": "text/event-stream", "last-event-id": a_id}
            own = _events(await _get_lines(http, running_gateway.url, a_get))
    for response in (foreign, unknown, malformed):
        body = assert_error(response, 400, -32600, "last_event_id_unknown")
        assert "progress" not in response.text
        assert body["error"] == assert_error(unknown, 400, -32600, "last_event_id_unknown")["error"]
    assert own[-1][1]["id"] == 5


async def test_a_session_before_2025_11_25_gets_no_priming_event(running_gateway: RunningGateway) -> None:
    """A 2025-06-18 session's SSE answer opens with its first message, not an empty-data event."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        opening: list[str] = []
        with anyio.fail_after(20):
            async with http.stream(
                "POST", running_gateway.url, headers=session_headers(session_id), json=SLOW_CALL
            ) as response:
                async for line in response.aiter_lines():
                    opening.append(line)
                    if len(opening) == 3:
                        break
    assert opening[0].startswith("id: ") and opening[1] == "event: message"
    assert json.loads(opening[2].removeprefix("data: "))["method"] == "notifications/progress"


async def test_get_stream_events_carry_ids_and_resume_after_the_last_seen(
    running_gateway: RunningGateway,
) -> None:
    """The GET stream numbers its events; a reconnect with Last-Event-ID gets only the later ones."""
    gateway = running_gateway.gateway
    async with running_gateway.raw() as http:
        get_headers = {
            **await _open_priming_session(http, running_gateway.url),
            "accept": "text/event-stream",
        }
        opening: list[str] = []
        with anyio.fail_after(10):
            async with http.stream("GET", running_gateway.url, headers=get_headers) as response:
                await gateway.broadcast_tools_changed("tools")
                await gateway.broadcast_tools_changed("tools")
                received = await _message_ids(response, 2, opening)
            await gateway.broadcast_tools_changed("tools")
            async with http.stream(
                "GET", running_gateway.url, headers={**get_headers, "last-event-id": received[0]}
            ) as response:
                replayed = await _message_ids(response, 2)
    key = received[0].rpartition("-")[0]
    assert received == [f"{key}-1", f"{key}-2"]
    assert replayed == [f"{key}-2", f"{key}-3"]
    # The stream opened with a priming event: where it starts, the reconnection delay, no data.
    assert opening[:4] == [f"id: {key}-0", "retry: 1000", "data: ", ""]


async def test_replay_is_bounded_and_refuses_a_gap(running_gateway: RunningGateway) -> None:
    """Past the per-stream bound the oldest events go; an id with successors gone is refused, not skipped."""
    gateway = running_gateway.gateway
    limit = gateway.snapshot().gateway.sse_replay_events
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        transport_session = next(s for s in gateway.registry if s.id == session_id)
        stream = transport_session.server_stream
        for _ in range(limit + 5):
            await gateway.broadcast_tools_changed("tools")
        get_headers = {**session_headers(session_id), "accept": "text/event-stream"}
        with anyio.fail_after(10):
            gone = await http.get(
                running_gateway.url, headers={**get_headers, "last-event-id": stream.event_id(2)}
            )
            held = {**get_headers, "last-event-id": stream.event_id(5)}
            async with http.stream("GET", running_gateway.url, headers=held) as response:
                replayed = await _message_ids(response, limit)
    assert_error(gone, 400, -32600, "last_event_id_unknown")
    assert replayed[0] == stream.event_id(6)
    assert replayed[-1] == stream.event_id(limit + 5)
