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
import json
import sys
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS
from tests.e2e.upstream_support import client_through_bastion, listening_upstream, text_of
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


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


def _sse_events(text: str) -> list[tuple[str, str | None, str]]:
    """(id, retry, data) of each SSE event in ``text``, priming events (empty data) included."""
    events: list[tuple[str, str | None, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields = dict(
            line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in block.split("\n")
        )
        if "id" in fields or "data" in fields:
            events.append((fields.get("id", ""), fields.get("retry"), fields.get("data", "")))
    return events


async def test_an_upstream_polling_close_is_mirrored_to_the_client_who_resumes_with_last_event_id(
    tmp_path: Path, with_event_store: str
) -> None:
    """The upstream ends its stream mid-call to be polled, and so does Bastion; a GET resumes the answer."""
    config = {
        "servers": {"fx": {"url": with_event_store, "era": "session", "transparent": True}},
        "agents": {"suite": {"anonymous": True}},
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="test"), RuntimeOptions(tmp_path / "data")
    )
    accept = {"accept": "application/json, text/event-stream"}
    async with serve_on_loopback(app) as url, httpx2.AsyncClient(timeout=30) as http:
        with anyio.fail_after(30):
            opened = await http.post(url, headers=accept, json=_INITIALIZE)
            session = {**accept, "mcp-session-id": opened.headers["mcp-session-id"]}
            await http.post(
                url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
            )
            call = {"name": "test_reconnection", "arguments": {}}
            posted = await http.post(
                url, headers=session, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
            )
            # The POST stream: a priming event (an id, the upstream's retry hint, no data), then its end.
            [(event_id, retry, data)] = _sse_events(posted.text)
            resumed = await http.get(url, headers={**session, "last-event-id": event_id})
    assert posted.headers["content-type"].startswith("text/event-stream")
    assert event_id and retry == "500" and data == ""
    answers = [json.loads(data) for _, _, data in _sse_events(resumed.text) if data]
    assert [answer["id"] for answer in answers] == [1]
    assert answers[0]["result"]["content"][0]["text"] == "Reconnection test completed"


async def test_the_stdio_adapter_resumes_an_answer_bastion_let_go_mid_call(
    tmp_path: Path, with_event_store: str
) -> None:
    """Through ``bastion connect`` the polling close costs nothing: the adapter fetches the answer by GET."""
    config = {
        "servers": {"fx": {"url": with_event_store, "era": "session", "transparent": True}},
        "agents": {"alice": {"token_sha256": hash_token(TOKENS["alice"])}},
    }
    credential = tmp_path / "agent.token"
    credential.write_text(TOKENS["alice"] + "\n")
    app = create_app(
        snapshot_from_mapping(config, source=None, version="test"), RuntimeOptions(tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        connect = ["-m", "bastion.cli.main", "connect", "--url", url, "--credential", str(credential)]
        with anyio.fail_after(60):
            async with Client(
                StdioServerParameters(command=sys.executable, args=connect), mode="legacy"
            ) as client:
                result = await client.call_tool("test_reconnection", {})
    assert result.is_error is False
    assert text_of(result) == "Reconnection test completed"
