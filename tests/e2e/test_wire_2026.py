"""The 2026-07-28 wire rules at the front door (issue 8 point 4), and the version header rule (point 5)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp.shared.subscriptions import ToolsListChanged

from tests.e2e.conftest import RunningGateway
from tests.e2e.test_transport_rules import (
    MODERN_META,
    assert_error,
    modern_headers,
    open_session,
    rpc,
    session_headers,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("method", ["ping", "initialize", "logging/setLevel"])
async def test_methods_removed_at_2026_are_404_method_not_found(
    running_gateway: RunningGateway, method: str
) -> None:
    """ping, initialize and logging/setLevel sent as 2026 requests get -32601 with HTTP 404 and their id."""
    params: dict[str, Any] = {"_meta": MODERN_META}
    if method == "logging/setLevel":
        params["level"] = "info"
    if method == "initialize":
        params.update(protocolVersion="2026-07-28", capabilities={}, clientInfo={"name": "t", "version": "1"})
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url, headers=modern_headers(method), json=rpc(method, params, request_id=41)
        )
    body = assert_error(response, 404, -32601, "method_not_found")
    assert body["id"] == 41
    assert len(running_gateway.gateway.registry) == 0  # an initialize at 2026 opened no session


async def test_session_era_keeps_ping_and_has_no_listen(running_gateway: RunningGateway) -> None:
    """In a session ping still answers, and subscriptions/listen and server/discover do not exist."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        ping = await http.post(running_gateway.url, headers=session_headers(session_id), json=rpc("ping"))
        listen = await http.post(
            running_gateway.url,
            headers=session_headers(session_id),
            json=rpc("subscriptions/listen", {"notifications": {"toolsListChanged": True}}),
        )
        discover = await http.post(
            running_gateway.url, headers=session_headers(session_id), json=rpc("server/discover")
        )
    assert ping.json()["result"] == {}
    assert_error(listen, 200, -32601, "method_not_found")
    assert_error(discover, 200, -32601, "method_not_found")


async def test_unsupported_version_carries_the_id_and_the_discover_list(
    running_gateway: RunningGateway,
) -> None:
    """An unsupported revision is -32022 with the request's id, naming exactly server/discover's versions."""
    future_meta = {**MODERN_META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    async with running_gateway.raw() as http:
        discover = await http.post(
            running_gateway.url,
            headers=modern_headers("server/discover"),
            json=rpc("server/discover", {"_meta": MODERN_META}),
        )
        enveloped = await http.post(
            running_gateway.url,
            headers=modern_headers("tools/list", version="2099-01-01"),
            json=rpc("tools/list", {"_meta": future_meta}, request_id=7),
        )
        session_id = await open_session(http, running_gateway.url)
        bare = await http.post(
            running_gateway.url,
            headers=session_headers(session_id, version="1999-01-01"),
            json=rpc("tools/list", request_id="q-8"),
        )
        notification = await http.post(
            running_gateway.url,
            headers=modern_headers("notifications/x", version="2099-01-01"),
            json=rpc("notifications/x", request_id=None),
        )
    supported = discover.json()["result"]["supportedVersions"]
    first = assert_error(enveloped, 400, -32022, "unsupported_protocol_version")
    second = assert_error(bare, 400, -32022, "unsupported_protocol_version")
    assert_error(notification, 400, -32022, "unsupported_protocol_version")
    assert first["id"] == 7
    assert second["id"] == "q-8"
    assert first["error"]["data"]["supported"] == supported == second["error"]["data"]["supported"]
    assert first["error"]["data"]["requested"] == "2099-01-01"
    assert second["error"]["data"]["requested"] == "1999-01-01"


async def test_relayed_missing_capability_goes_out_as_400(running_gateway: RunningGateway) -> None:
    """An upstream's -32021 (missing client capability) reaches a 2026 client with the HTTP 400 it maps to."""
    params = {"name": "tools__ask_user", "arguments": {"question": "q"}, "_meta": MODERN_META}
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url,
            headers=modern_headers("tools/call", "tools__ask_user"),
            json=rpc("tools/call", params, request_id=3),
        )
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["id"] == 3
    assert body["error"]["code"] == -32021


async def test_missing_version_header_uses_the_negotiated_version(running_gateway: RunningGateway) -> None:
    """After initialize, a request without MCP-Protocol-Version is served at the negotiated version."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        no_header = session_headers(session_id)
        del no_header["mcp-protocol-version"]
        listed = await http.post(running_gateway.url, headers=no_header, json=rpc("tools/list"))
        called = await http.post(
            running_gateway.url,
            headers=no_header,
            json=rpc("tools/call", {"name": "tools__echo", "arguments": {"text": "plain"}}, request_id=2),
        )
        other = await http.post(
            running_gateway.url, headers=session_headers(session_id, version="2025-03-26"), json=rpc("ping")
        )
    assert listed.status_code == 200
    assert any(t["name"] == "tools__echo" for t in listed.json()["result"]["tools"])
    assert called.json()["result"]["content"][0]["text"] == "plain"
    assert other.status_code == 200  # another supported revision: the negotiated one governs


async def test_listen_delivers_tools_list_changed_to_the_official_client(
    running_gateway: RunningGateway,
) -> None:
    """A 2026 client's subscriptions/listen is acknowledged (tools only) and receives tools/list_changed."""
    async with running_gateway.client(mode="auto") as client:
        assert client.protocol_version == "2026-07-28"
        async with client.listen(tools_list_changed=True, prompts_list_changed=True) as subscription:
            assert subscription.honored.tools_list_changed is True
            assert subscription.honored.prompts_list_changed is True  # issue 9
            assert len(running_gateway.gateway.listeners) == 1
            await running_gateway.gateway.broadcast_tools_changed("tools")
            with anyio.fail_after(10):
                event = await subscription.__anext__()
    assert isinstance(event, ToolsListChanged)


async def test_listen_frames_carry_the_subscription_id(running_gateway: RunningGateway) -> None:
    """Every listen frame names the listen request's id; a kind not asked for is never delivered."""
    frames: list[dict[str, Any]] = []
    params = {"notifications": {"promptsListChanged": True}, "_meta": MODERN_META}
    async with running_gateway.raw() as http:
        with anyio.fail_after(10):
            async with http.stream(
                "POST",
                running_gateway.url,
                headers=modern_headers("subscriptions/listen"),
                json=rpc("subscriptions/listen", params, request_id="sub-1"),
            ) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        frames.append(json.loads(line[5:]))
                        await running_gateway.gateway.broadcast_tools_changed("tools")
                        running_gateway.gateway.listeners.close_all()
    assert frames[0]["method"] == "notifications/subscriptions/acknowledged"
    assert frames[0]["params"]["notifications"] == {"promptsListChanged": True}
    assert frames[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
    # No tools/list_changed (not asked for); the graceful end is the listen result with the same id.
    assert [f.get("method") for f in frames[1:]] == [None]
    assert frames[-1]["id"] == "sub-1"
    assert frames[-1]["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
