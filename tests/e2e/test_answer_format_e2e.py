"""JSON or SSE for a POST's answer, as the client's ``Accept`` ranks them, through ``bastion serve``.

A session-era client (2025-11-25) that lists ``text/event-stream`` first is answered with a stream
that opens with a priming event, even when nothing precedes the result (the conformance suite's
``server-sse-multiple-streams``, several such POSTs at once); one that lists JSON first, as the
SDK clients do, gets one JSON body.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.test_tasks_extension_e2e import serving, session_era

pytestmark = pytest.mark.anyio


async def test_the_answer_takes_the_form_the_client_ranks_first(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with serving(tmp_path, "auto") as (url, _), httpx.AsyncClient(timeout=30) as http:
            headers, _, _ = await session_era(http, url, "alice", capabilities={})

            async def tools_list(request_id: int, accept: str) -> httpx.Response:
                message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": {}}
                return await http.post(url, headers={**headers, "accept": accept}, json=message)

            as_json = await tools_list(1, "application/json, text/event-stream")
            assert as_json.headers["content-type"] == "application/json"
            assert as_json.json()["result"]["tools"]

            streams: list[httpx.Response] = []

            async def stream_one(request_id: int) -> None:
                streams.append(await tools_list(request_id, "text/event-stream, application/json"))

            async with anyio.create_task_group() as group:
                for request_id in (10, 11, 12):
                    group.start_soon(stream_one, request_id)
    assert len(streams) == 3
    for response in streams:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [event for event in response.text.split("\n\n") if event.strip()]
        assert events[0].startswith("id: ") and "data: " in events[0]  # the priming event, no payload
        [payload] = [line[6:] for line in events[1].splitlines() if line.startswith("data: ")]
        answer = json.loads(payload)
        assert answer["id"] in (10, 11, 12) and answer["result"]["tools"]
