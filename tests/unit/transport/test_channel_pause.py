"""``ResponseChannel.pause``: the upstream's polling close, mirrored only where a client can resume."""

from __future__ import annotations

import json

import pytest

from bastion.session.replay import ReplayLimits, SessionStreams
from bastion.transport.channel import ResponseChannel
from tests.support.asgi_send import RecordedSend

pytestmark = pytest.mark.anyio

_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}


async def test_a_sessionless_answer_is_not_paused_and_goes_out_as_json() -> None:
    """Without a session to resume in, a pause changes nothing: the answer is one JSON body."""
    sent = RecordedSend()
    channel = ResponseChannel(sent, sse_allowed=True)
    await channel.pause(500)
    await channel.finish(_ANSWER)
    assert dict(sent.messages[0]["headers"])[b"content-type"] == b"application/json"
    assert json.loads(sent.body()) == _ANSWER


async def test_a_session_before_2025_11_25_is_never_paused() -> None:
    """Without priming (an older revision's session) a pause changes nothing: the answer stays on the POST."""
    sent, streams = RecordedSend(), SessionStreams(ReplayLimits())
    channel = ResponseChannel(sent, sse_allowed=True, open_stream=streams.open_response_stream)
    await channel.pause(500)
    await channel.finish(_ANSWER)
    assert json.loads(sent.body()) == _ANSWER


async def test_a_paused_session_answer_ends_after_priming_and_keeps_the_rest_for_resumption() -> None:
    """In the session era the POST gets the priming event and ends; the answer is kept on its stream."""
    sent, streams = RecordedSend(), SessionStreams(ReplayLimits())
    channel = ResponseChannel(sent, sse_allowed=True, open_stream=streams.open_response_stream, priming=True)
    await channel.pause(60_000)  # an upstream's hint is passed on within Bastion's own bound
    await channel.finish(_ANSWER)
    lines = sent.body().decode().split("\n")
    event_id = lines[0].removeprefix("id: ")
    stream, after = streams.resume(event_id)
    assert lines[1:] == ["retry: 5000", "data: ", "", ""]
    assert sent.messages[-1]["more_body"] is False and len(sent.messages) == 3  # start, priming, end
    assert [json.loads(payload) for _, payload in stream.after(after)] == [_ANSWER]
    assert stream.finished
