"""HTTP-level reading and writing for the front door: body limits, disconnects, 202s, error answers,
and which of JSON and SSE a client prefers for an answer (``prefers_sse``).

Plain ASGI helpers shared by ``transport/streamable_http.py`` and
``transport/resume.py``; they decide nothing about MCP.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any

import anyio
from starlette.datastructures import Headers
from starlette.types import Receive, Send

from bastion.errors import BastionError, BodyTooLarge, InvalidRequest
from bastion.transport.jsonrpc import RequestId, dumps, error_message

__all__ = [
    "accepted",
    "detached",
    "disconnect_cancels",
    "meta_of",
    "prefers_sse",
    "read_body",
    "reject",
    "watch_disconnect",
]


_SSE, _JSON = "text/event-stream", "application/json"


def prefers_sse(accept: str) -> bool:
    """Whether an ``Accept`` header ranks ``text/event-stream`` above ``application/json``: a higher
    ``q``, or the same ``q`` and listed first (the SDK clients list JSON first; a client that lists
    SSE first is answered with a stream even when nothing precedes the result). Wildcards rank
    neither."""
    ranks: dict[str, tuple[float, int]] = {}
    for position, item in enumerate(accept.split(",")):
        media, *parameters = (part.strip() for part in item.split(";"))
        media = media.lower()
        if media not in (_SSE, _JSON) or media in ranks:
            continue
        q = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranks[media] = (q, -position)
    sse, json = ranks.get(_SSE), ranks.get(_JSON)
    return sse is not None and sse[0] > 0 and (json is None or sse > json)


def meta_of(decoded: dict[str, Any]) -> dict[str, Any]:
    params = decoded.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else {}


async def watch_disconnect(receive: Receive, call_scope: anyio.CancelScope | None) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if call_scope is not None:
                call_scope.cancel()
            return


@contextlib.contextmanager
def disconnect_cancels(receive: Receive, scope: anyio.CancelScope) -> Iterator[None]:
    """While inside, the client's disconnect cancels ``scope``.

    One plain task watches ``receive``, cancelled on the way out and not waited for: a
    task group per request would cost a cancel scope and a loop turn more (issue #13).
    """
    watcher = detached(watch_disconnect(receive, scope))
    try:
        yield
    finally:
        watcher.cancel()


def detached(coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """Run ``coroutine`` as one plain task of its own; keep the task (the loop holds it weakly)."""
    task = asyncio.ensure_future(coroutine)
    task.add_done_callback(_retrieve)
    return task


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # a watcher that failed has nothing to cancel; never "never retrieved"


async def read_body(receive: Receive, headers: Headers, limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyTooLarge(limit=limit)
        except ValueError as exc:
            raise InvalidRequest("Invalid Request: bad Content-Length") from exc
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("Invalid Request: the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit=limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def accepted(send: Send) -> None:
    await send({"type": "http.response.start", "status": 202, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def reject(
    send: Send,
    error: BastionError,
    request_id: RequestId | None,
    *,
    status: int | None = None,
    challenge: str = 'Bearer realm="bastion"',
) -> None:
    body = dumps(error_message(request_id, error))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.http_status == 401:
        headers.append((b"www-authenticate", challenge.encode()))
    if error.http_status == 405:
        headers.append((b"allow", b"GET, POST, DELETE"))
    if error.http_status == 429:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status or error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
