"""The conformance fixture itself: where it departs from the bare SDK, it does so as the spec says."""

from __future__ import annotations

import sys

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.upstream_support import listening_upstream

pytestmark = pytest.mark.anyio


async def test_an_unknown_tool_is_a_protocol_error_not_a_tool_result() -> None:
    """Calling a tool the fixture lacks gets JSON-RPC -32602 "Unknown tool", as Bastion answers it."""
    argv = [sys.executable, "-m", "tests.fixtures.conformance_server", "--port", "0"]
    with listening_upstream(argv) as url:
        async with (
            httpx2.AsyncClient(timeout=30) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            with anyio.fail_after(30), pytest.raises(MCPError) as refused:
                await client.call_tool("slow_compute", {"seconds": 0})
            known = await client.call_tool("greet", {"name": "x"})
    assert refused.value.error.code == -32602
    assert refused.value.error.message == "Unknown tool: slow_compute"
    assert known.is_error is False
