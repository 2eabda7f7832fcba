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


async def test_a_priming_event_gives_its_id_without_a_message_or_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An event with an id and empty data is no message and no warning, but its id is kept to resume from."""
    body = priming_frame("k-0", 500) + sse_frame(b'{"jsonrpc":"2.0","id":1,"result":{}}', "k-1")
    with caplog.at_level(logging.WARNING, logger="bastion.transport.stdio_adapter"):
        messages = [item async for item in _sse_messages(_lines(body))]
    assert messages == [("k-0", None), ("k-1", {"jsonrpc": "2.0", "id": 1, "result": {}})]
    assert caplog.records == []
