"""``wire.prefers_sse``: which of JSON and SSE an ``Accept`` ranks first, and the channel that follows."""

from __future__ import annotations

import json

import pytest

from bastion.session.replay import ReplayLimits, SessionStreams
from bastion.transport.channel import ResponseChannel
from bastion.transport.wire import prefers_sse
from tests.support.asgi_send import RecordedSend

pytestmark = pytest.mark.anyio

_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("application/json, text/event-stream", False),  # the SDK clients' order
        ("text/event-stream, application/json", True),  # the conformance suite's
        ("text/event-stream", True),
        ("application/json", False),
        ("*/*", False),
        ("application/json;q=0.5, text/event-stream", True),
        ("text/event-stream;q=0.5, application/json", False),
        ("TEXT/EVENT-STREAM ; q=1.0 , application/json;q=0.9", True),
        ("text/event-stream;q=0, application/json", False),
        ("text/event-stream;q=bogus, application/json", False),
        ("", False),
    ],
)
def test_the_first_ranked_media_type_decides(accept: str, expected: bool) -> None:
    assert prefers_sse(accept) is expected


async def test_a_client_that_ranks_sse_first_gets_its_result_as_a_primed_numbered_event() -> None:
    sent, streams = RecordedSend(), SessionStreams(ReplayLimits())
    channel = ResponseChannel(
        sent, sse_allowed=True, open_stream=streams.open_response_stream, priming=True, prefer_sse=True
    )
    await channel.finish(_ANSWER)
    assert sent.content_type() == b"text/event-stream"
    events = sent.body().decode().split("\n\n")
    assert events[0].startswith("id: ") and events[0].endswith("data: ")  # the priming event
    assert events[1].startswith("id: ") and json.loads(events[1].split("data: ", 1)[1]) == _ANSWER


async def test_a_result_with_another_status_than_200_stays_json_whatever_the_client_prefers() -> None:
    sent = RecordedSend()
    channel = ResponseChannel(sent, sse_allowed=True, prefer_sse=True)
    await channel.finish(_ANSWER, status=400)
    assert sent.messages[0]["status"] == 400 and sent.content_type() == b"application/json"


async def test_without_the_preference_the_answer_is_json() -> None:
    sent = RecordedSend()
    await ResponseChannel(sent, sse_allowed=True).finish(_ANSWER)
    assert sent.content_type() == b"application/json" and json.loads(sent.body()) == _ANSWER
