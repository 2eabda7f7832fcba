"""The stdio adapter's reading of the gateway's SSE answers (issue 8: priming events)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from bastion.transport.sse_out import priming_frame, sse_frame
from bastion.transport.stdio_adapter import _sse_messages

pytestmark = pytest.mark.anyio


async def _lines(body: bytes) -> AsyncIterator[str]:
    for line in body.decode().split("\n"):
        yield line


async def test_a_priming_event_is_skipped_silently_and_the_next_message_keeps_its_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An event with an id and empty data is no message and no warning; the message after it arrives."""
    body = priming_frame("k-0", 500) + sse_frame(b'{"jsonrpc":"2.0","id":1,"result":{}}', "k-1")
    with caplog.at_level(logging.WARNING, logger="bastion.transport.stdio_adapter"):
        messages = [item async for item in _sse_messages(_lines(body))]
    assert messages == [("k-1", {"jsonrpc": "2.0", "id": 1, "result": {}})]
    assert caplog.records == []
