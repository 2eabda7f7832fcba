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
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.testing.loopback import serve_on_loopback
from tests.e2e.conftest import TOKENS, _stop

pytestmark = pytest.mark.anyio


@contextlib.contextmanager
def _fixture_server(*extra: str) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.conformance_server", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("LISTENING "), f"fixture did not start: {line!r}"
        yield line.split()[1]
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def with_event_store() -> Iterator[str]:
    with _fixture_server("--event-store") as url:
        yield url


@pytest.fixture(scope="module")
def without_event_store() -> Iterator[str]:
    with _fixture_server() as url:
        yield url


@contextlib.asynccontextmanager
async def _client_through_bastion(tmp_path: Path, upstream_url: str, era: str) -> AsyncIterator[Client]:
    config = {
        "servers": {"fx": {"url": upstream_url, "era": era}},
        "agents": {"alice": {"token_sha256": hash_token(TOKENS["alice"])}},
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path / "d")
    )
    async with (
        serve_on_loopback(app) as url,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS['alice']}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        yield client


def _text(result: object) -> str:
    content = getattr(result, "content", [])
    return " ".join(block.text for block in content if isinstance(block, TextContent))


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
    assert _text(result) == "Reconnection test completed"


@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_an_upstream_without_an_event_store_answers_as_before(
    tmp_path: Path, without_event_store: str, era: str
) -> None:
    """Without an event store there is no priming event and nothing to resume; calls answer as before."""
    async with _client_through_bastion(tmp_path, without_event_store, era) as client:
        assert (
            _text(await client.call_tool("fx__test_simple_text", {}))
            == "This is a simple text response for testing."
        )
        assert _text(await client.call_tool("fx__test_reconnection", {})) == "Reconnection test completed"
