"""Resuming an upstream SSE stream that drops mid-call (upstream/resume.py), over a real socket.

The upstream here is a small Starlette app: its POST stream sends a priming event and one
notification, then the connection is cut before the answer (the body raises, so uvicorn
aborts it without the final chunk); its GET replays what follows the ``Last-Event-ID`` it
is sent. That is the "stream dropped mid-call and resumed" case of issue 8.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from bastion.upstream.http_client import HttpFailure, UpstreamHttp, UpstreamResponse
from bastion.upstream.resume import Reconnect, messages_resuming
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

NOTE = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}
ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}


def _event(event_id: str | None, data: dict[str, Any] | None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {json.dumps(data) if data is not None else ''}\n\n".encode()


def _upstream(*, ids: bool, replay: bool) -> tuple[Starlette, list[str]]:
    asked: list[str] = []

    async def post(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield (b"retry: 10\n" if ids else b"") + _event("e1" if ids else None, None if ids else NOTE)
            if ids:
                yield _event("e2", NOTE)
            await anyio.sleep(0.05)
            raise RuntimeError("the upstream dropped the connection mid-call")

        return StreamingResponse(body(), media_type="text/event-stream")

    async def get(request: Request) -> Response:
        asked.append(request.headers.get("last-event-id", ""))
        if not replay:
            return Response(status_code=405)
        return StreamingResponse(iter([_event("e3", ANSWER)]), media_type="text/event-stream")

    app = Starlette(routes=[Route("/mcp", post, methods=["POST"]), Route("/mcp", get, methods=["GET"])])
    return app, asked


async def _read(url: str, client: UpstreamHttp, reconnect: Reconnect | None) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    async with (
        client.stream("POST", url, headers={}, content=b"{}") as response,
        contextlib.aclosing(messages_resuming(response, reconnect)) as messages,
    ):
        async for message in messages:
            received.append(message)
            if message.get("id") == 1:
                break
    return received


def _reconnect(client: UpstreamHttp, url: str) -> Reconnect:
    @contextlib.asynccontextmanager
    async def reconnect(last_event_id: str) -> AsyncIterator[UpstreamResponse]:
        async with client.stream("GET", url, headers={"last-event-id": last_event_id}) as response:
            yield response

    return reconnect


async def test_a_dropped_stream_with_event_ids_is_resumed_from_the_last_event() -> None:
    """The connection breaks after event e2; a GET with Last-Event-ID e2 brings the answer, nothing twice."""
    app, asked = _upstream(ids=True, replay=True)
    with anyio.fail_after(20):
        async with serve_on_loopback(app) as url, UpstreamHttp(read_timeout_s=10) as client:
            received = await _read(url, client, _reconnect(client, url))
    assert received == [NOTE, ANSWER]
    assert asked == ["e2"]


async def test_a_dropped_stream_without_event_ids_is_not_resumable() -> None:
    """An upstream that numbers nothing (no event store) cannot be resumed: the break surfaces."""
    app, asked = _upstream(ids=False, replay=True)
    with anyio.fail_after(20):
        async with serve_on_loopback(app) as url, UpstreamHttp(read_timeout_s=10) as client:
            with pytest.raises(HttpFailure):
                await _read(url, client, _reconnect(client, url))
    assert asked == []


async def test_an_upstream_that_refuses_the_get_ends_the_stream_without_an_answer() -> None:
    """A 405 to the resuming GET ends the messages; the caller sees no answer (its outcome_unknown stands)."""
    app, asked = _upstream(ids=True, replay=False)
    with anyio.fail_after(20):
        async with serve_on_loopback(app) as url, UpstreamHttp(read_timeout_s=10) as client:
            received = await _read(url, client, _reconnect(client, url))
    assert received == [NOTE]
    assert asked == ["e2"]


async def test_without_a_reconnect_a_drop_is_never_resumed() -> None:
    """The sessionless era has no GET: the break surfaces even when events carry ids."""
    app, asked = _upstream(ids=True, replay=True)
    with anyio.fail_after(20):
        async with serve_on_loopback(app) as url, UpstreamHttp(read_timeout_s=10) as client:
            with pytest.raises(HttpFailure):
                await _read(url, client, None)
    assert asked == []


async def test_after_the_answer_a_stream_left_open_is_dropped_within_the_drain_bound() -> None:
    """An upstream that keeps streaming after the answer: the messages end at once, nothing resumed."""
    asked: list[str] = []

    async def post(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"retry: 10\n" + _event("e1", ANSWER)
            while True:
                await anyio.sleep(0.01)
                yield _event("e2", NOTE)

        return StreamingResponse(body(), media_type="text/event-stream")

    async def get(request: Request) -> Response:
        asked.append(request.headers.get("last-event-id", ""))
        return Response(status_code=405)

    app = Starlette(routes=[Route("/mcp", post, methods=["POST"]), Route("/mcp", get, methods=["GET"])])
    with anyio.fail_after(20):
        async with (
            serve_on_loopback(app) as url,
            UpstreamHttp(read_timeout_s=10) as client,
            client.stream("POST", url, headers={}, content=b"{}") as response,
        ):
            messages = messages_resuming(
                response, _reconnect(client, url), is_last=lambda m: m.get("id") == 1
            )
            received = [message async for message in messages]  # an endless stream: ends by the bound
    assert received == [ANSWER]
    assert asked == []
