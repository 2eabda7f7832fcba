"""The anonymous loopback agent and the transparent server, end to end (issue 8; issue 9 point 3).

A client that sends no credential (the conformance suite) is the configured anonymous agent:
it sees the transparent server's tools under their own names, its calls are audited under
its name and bound by its grants; a wrong credential is never downgraded to anonymous; and
without an anonymous agent a credential-less request is refused as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import Gateway, RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream
from tests.e2e.issue4_support import entries_with_event
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


def _config(tools_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "servers": {"tools": {"url": tools_url, "transparent": True}},
        "agents": {"suite": {"anonymous": True}, "alice": {"token_sha256": hash_token(TOKENS["alice"])}},
        **extra,
    }


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[tuple[str, Gateway]]:
    snapshot = snapshot_from_mapping(config, source=None, version="test")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        yield url, app.state.gateway


@contextlib.asynccontextmanager
async def _client(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=headers or {}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        yield client


async def test_a_client_without_credentials_is_the_anonymous_agent_and_sees_unprefixed_tools(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Without credentials the SDK client calls the transparent server's own names, audited as anonymous."""
    async with _gateway(tmp_path, _config(tools_upstream.url)) as (url, _), _client(url) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "echo" in names and not any(name.startswith("tools__") for name in names)
        result = await client.call_tool("echo", {"text": "hi"})
        assert result.is_error is False
    completed = entries_with_event(tmp_path / "data" / "bastion.db", "completed")
    assert [entry["agent"] for entry in completed] == ["suite"]


async def test_a_wrong_credential_is_refused_even_when_an_anonymous_agent_exists(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A request carrying an unknown bearer token gets 401; it never falls back to the anonymous agent."""
    gateway = _gateway(tmp_path, _config(tools_upstream.url))
    async with gateway as (url, _), httpx2.AsyncClient(timeout=30) as http:
        headers = {
            "authorization": "Bearer not-a-real-token",
            "accept": "application/json, text/event-stream",
        }
        response = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert response.status_code == 401


async def test_grants_bind_the_anonymous_agent(tmp_path: Path, tools_upstream: Upstream) -> None:
    """Once grants exist, the anonymous agent calls only what a grant gives it."""
    grants = [{"name": "suite-echo", "agent": "suite", "servers": ["tools"], "tools": ["echo"]}]
    async with (
        _gateway(tmp_path, _config(tools_upstream.url, grants=grants)) as (url, _),
        _client(url) as client,
    ):
        assert {tool.name for tool in (await client.list_tools()).tools} == {"echo"}
        with pytest.raises(MCPError):
            await client.call_tool("add", {"a": 1, "b": 2})


async def test_without_an_anonymous_agent_a_request_without_credentials_is_refused(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """The default configuration has no anonymous agent: no credential is a 401."""
    config = _config(tools_upstream.url)
    del config["agents"]["suite"]
    async with _gateway(tmp_path, config) as (url, _), httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(
            url,
            headers={"accept": "application/json, text/event-stream"},
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        )
    assert response.status_code == 401
