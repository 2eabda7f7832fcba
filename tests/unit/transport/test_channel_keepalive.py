"""``ResponseChannel.kept_alive``: comment lines on a slow SSE answer, nothing on a fast or JSON one."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from bastion.session.replay import ReplayLimits, SessionStreams
from bastion.transport.channel import ResponseChannel
from bastion.transport.sse_out import KEEPALIVE_FRAME
from tests.support.asgi_send import RecordedSend

pytestmark = pytest.mark.anyio

_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}
_TICK_S = 0.02
_BOUND_S = 10.0


class _Sent(RecordedSend):
    """An ASGI ``send`` that records, and tells when the ``n``-th comment went out."""

    def __init__(self) -> None:
        super().__init__()
        self.comment = anyio.Event()

    async def __call__(self, message: dict[str, Any]) -> None:
        await super().__call__(message)
        if message.get("body") == KEEPALIVE_FRAME:
            self.comment.set()
            self.comment = anyio.Event()

    async def comments(self, count: int) -> None:
        with anyio.fail_after(_BOUND_S):
            while self.body().count(KEEPALIVE_FRAME) < count:
                await self.comment.wait()


async def test_a_slow_sse_answer_gets_comments_until_the_answer_and_none_after() -> None:
    sent = _Sent()
    channel = ResponseChannel(sent, sse_allowed=True)
    with channel.kept_alive(_TICK_S):
        await sent.comments(3)
    await channel.finish(_ANSWER)
    await anyio.sleep(5 * _TICK_S)  # a timer left running would write past the answer
    assert dict(sent.messages[0]["headers"])[b"content-type"] == b"text/event-stream"
    comments, _, answer = sent.body().rpartition(KEEPALIVE_FRAME)
    assert set(comments.split(KEEPALIVE_FRAME)) <= {b""}
    assert json.loads(answer.removeprefix(b"event: message\ndata: ")) == _ANSWER
    assert sent.messages[-1]["more_body"] is False


async def test_a_fast_answer_stays_json() -> None:
    sent = _Sent()
    channel = ResponseChannel(sent, sse_allowed=True)
    with channel.kept_alive(5 * _TICK_S):
        pass
    await channel.finish(_ANSWER)
    await anyio.sleep(10 * _TICK_S)
    assert dict(sent.messages[0]["headers"])[b"content-type"] == b"application/json"
    assert json.loads(sent.body()) == _ANSWER


async def test_a_json_only_client_gets_no_comment_however_slow() -> None:
    sent = _Sent()
    channel = ResponseChannel(sent, sse_allowed=False)
    with channel.kept_alive(_TICK_S):
        await anyio.sleep(10 * _TICK_S)
    await channel.finish(_ANSWER)
    assert json.loads(sent.body()) == _ANSWER


async def test_comments_stop_on_the_post_once_a_get_resumed_its_stream() -> None:
    """Session era: the stream opens primed; after a GET takes it over the POST gets no more comments."""
    sent, streams = _Sent(), SessionStreams(ReplayLimits())
    channel = ResponseChannel(sent, sse_allowed=True, open_stream=streams.open_response_stream, priming=True)
    with channel.kept_alive(_TICK_S):
        await sent.comments(1)
        event_id = sent.body().decode().split("\n")[0].removeprefix("id: ")
        stream, _ = streams.resume(event_id)
        stream.attach()  # what transport/resume.py does for the GET
        written = len(sent.messages)
        await anyio.sleep(10 * _TICK_S)
        assert len(sent.messages) == written
    await channel.finish(_ANSWER)
    assert sent.messages[written:] == [{"type": "http.response.body", "body": b"", "more_body": False}]
    assert json.loads(stream.after(0)[-1][1]) == _ANSWER  # the answer went to the stream the GET reads
    assert stream.finished
