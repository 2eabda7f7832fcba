"""Upstream SSE streams from real SDK servers, with and without an event store (issue 8 points 1 and 7).

The upstream is the project's conformance fixture (an ``mcp`` SDK server), run as a
subprocess. With an event store, every SSE stream it opens starts with a priming event
(an id and empty data) and a ``retry:`` hint: Bastion must read past it in both eras.
``test_reconnection`` closes its response stream mid-call and answers only on the
resumed stream: through a session-era upstream Bastion resumes with ``Last-Event-ID``
and the client gets the answer, as if nothing had dropped.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from mcp import Client

from tests.e2e.upstream_support import client_through_bastion, listening_upstream, text_of

pytestmark = pytest.mark.anyio


def _fixture_server(*flags: str) -> contextlib.AbstractContextManager[str]:
    return listening_upstream(
        [sys.executable, "-m", "tests.fixtures.conformance_server", "--port", "0", *flags]
    )


@pytest.fixture(scope="module")
def with_event_store() -> Iterator[str]:
    with _fixture_server("--event-store") as url:
        yield url


@pytest.fixture(scope="module")
def without_event_store() -> Iterator[str]:
    with _fixture_server() as url:
        yield url


def _client_through_bastion(
    tmp_path: Path, upstream_url: str, era: str
) -> AbstractAsyncContextManager[Client]:
    return client_through_bastion(tmp_path, "fx", upstream_url, era)


@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_priming_events_do_not_break_an_upstream_with_an_event_store(
    tmp_path: Path, with_event_store: str, era: str
) -> None:
    """Listing and a streamed call (progress) work through an upstream whose streams open with priming."""
    async with _client_through_bastion(tmp_path, with_event_store, era) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"fx__test_simple_text", "fx__test_tool_with_progress"} <= names
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        result = await client.call_tool("fx__test_tool_with_progress", {}, progress_callback=on_progress)
        assert result.is_error is False and progress == [0, 50, 100]


async def test_a_stream_the_upstream_closes_mid_call_is_resumed_with_last_event_id(
    tmp_path: Path, with_event_store: str
) -> None:
    """The upstream ends its response stream before answering; Bastion resumes it and relays the answer."""
    async with _client_through_bastion(tmp_path, with_event_store, "session") as client:
        result = await client.call_tool("fx__test_reconnection", {})
    assert result.is_error is False
    assert text_of(result) == "Reconnection test completed"


@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_an_upstream_without_an_event_store_answers_as_before(
    tmp_path: Path, without_event_store: str, era: str
) -> None:
    """Without an event store there is no priming event and nothing to resume; calls answer as before."""
    async with _client_through_bastion(tmp_path, without_event_store, era) as client:
        assert (
            text_of(await client.call_tool("fx__test_simple_text", {}))
            == "This is a simple text response for testing."
        )
        assert text_of(await client.call_tool("fx__test_reconnection", {})) == "Reconnection test completed"
