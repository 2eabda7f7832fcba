"""Upstream faults injected at the boundary we own: dying processes, vanishing sessions, hanging calls."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.upstream.stdio import StdioProcess, StdioUpstream
from bastion.upstream.streamable_http import HttpUpstreamSession
from tests.e2e.conftest import RunningGateway, Upstream, gateway_config
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


async def test_stdio_upstream_dies_mid_call_and_is_restarted(running_gateway: RunningGateway) -> None:
    """The caller gets a clear error, another client's concurrent call completes on its own process,
    and the crashed process comes back for its owner alone (issue 22)."""
    upstream = running_gateway.gateway.fleet.upstreams["notes"]
    assert isinstance(upstream, StdioUpstream)
    other_result: list[str] = []
    bob_started = anyio.Event()

    async def other_client() -> None:
        async with running_gateway.client("bob") as client:
            await client.call_tool("notes__echo", {"text": "warm"})  # bob's own process is up
            bob_started.set()
            result = await client.call_tool("tools__slow", {"seconds": 0.5, "steps": 2})
            other_result.append(result.content[0].text)  # type: ignore[union-attr]
            again = await client.call_tool("notes__echo", {"text": "bob after"})
            other_result.append(again.content[0].text)  # type: ignore[union-attr]

    async with anyio.create_task_group() as tg:
        tg.start_soon(other_client)
        async with running_gateway.client() as client:
            await client.call_tool("notes__echo", {"text": "warm"})
            with anyio.fail_after(30):
                await bob_started.wait()
            assert len(upstream.owned()) == 2  # one process per client session, none shared
            alice_session = next(s for s in running_gateway.gateway.registry if s.agent == "alice")
            alice = alice_session.upstream_sessions.get("notes")
            bob = next(p for p in upstream.owned().values() if p is not alice)
            assert isinstance(alice, StdioProcess) and alice.pid is not None
            alice_pid, bob_pid = alice.pid, bob.pid
            with pytest.raises(MCPError) as caught:
                await client.session.call_tool("notes__crash", {})
            with anyio.fail_after(15):
                while alice.pid == alice_pid or not alice.health().connected:
                    await anyio.sleep(0.05)
            result = await client.call_tool("notes__echo", {"text": "back"})
            assert alice_session.upstream_sessions.get("notes") is alice  # restarted for its owner
    assert bob.pid == bob_pid and bob.restarts == 0  # the other owner's process never noticed
    assert caught.value.error.data["reason"] == "outcome_unknown"
    assert other_result == ["done", "bob after"]
    assert result.content[0].text == "back"  # type: ignore[union-attr]


async def test_http_upstream_dies_mid_call(tmp_path: Path, fresh_tools_upstream: Upstream) -> None:
    """An HTTP upstream that dies mid-call: a typed error for that call; other namespaces keep working."""
    snapshot = snapshot_from_mapping(
        gateway_config(tmp_path, fresh_tools_upstream.url), source=None, version="t"
    )
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        gateway = RunningGateway(url, app.state.gateway, tmp_path)
        async with gateway.client() as client:
            with pytest.raises(MCPError) as caught:
                await client.session.call_tool("tools__crash", {})
            assert caught.value.error.data["reason"] == "outcome_unknown"
            # The upstream is gone: the next call is refused as unavailable (nothing was sent).
            with pytest.raises(MCPError) as unavailable:
                await client.session.call_tool("tools__echo", {"text": "x"})
            assert unavailable.value.error.data["reason"] == "upstream_unavailable"
            result = await client.call_tool("notes__echo", {"text": "stdio still fine"})
    assert result.content[0].text == "stdio still fine"  # type: ignore[union-attr]


async def test_session_era_upstream_404_reinitializes_transparently(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """When the upstream forgets a client's upstream session, the gateway re-initializes; calls succeed."""
    config = gateway_config(tmp_path, tools_upstream.url, era="session")
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        gateway = RunningGateway(url, app.state.gateway, tmp_path)
        async with gateway.client() as client, gateway.client("bob") as bob:
            await client.call_tool("tools__echo", {"text": "one"})
            await bob.call_tool("tools__echo", {"text": "bob"})
            sessions = list(gateway.gateway.registry)
            alice_session = next(s for s in sessions if s.agent == "alice")
            bob_session = next(s for s in sessions if s.agent == "bob")
            before = alice_session.upstream_sessions.get("tools")
            assert isinstance(before, HttpUpstreamSession) and before.session_id
            assert before.session_id != bob_session.upstream_sessions.get("tools").session_id  # never shared
            # Fault: the upstream drops that session (as after an upstream restart).
            async with httpx.AsyncClient() as http:
                dropped = await http.delete(
                    tools_upstream.url,
                    headers={
                        "mcp-session-id": before.session_id,
                        "mcp-protocol-version": before.protocol_version,
                    },
                )
            assert dropped.status_code in (200, 204)
            result = await client.call_tool("tools__echo", {"text": "two"})
            after = alice_session.upstream_sessions.get("tools")
            bob_after = bob_session.upstream_sessions.get("tools")
    assert result.content[0].text == "two"  # type: ignore[union-attr]
    assert isinstance(after, HttpUpstreamSession) and after.session_id not in (None, before.session_id)
    assert bob_after is not None and bob_after.session_id != after.session_id


async def test_hanging_upstream_is_bounded_by_the_timeout(tmp_path: Path, tools_upstream: Upstream) -> None:
    """A call that never returns ends with upstream_timeout at the configured bound; the gateway stays up."""
    config = gateway_config(tmp_path, tools_upstream.url, timeout_s=1.0)
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        gateway = RunningGateway(url, app.state.gateway, tmp_path)
        for mode in ("legacy", "auto"):
            async with gateway.client(mode=mode) as client:
                with anyio.fail_after(10), pytest.raises(MCPError) as caught:
                    await client.session.call_tool("tools__hang", {})
                assert caught.value.error.data["reason"] == "upstream_timeout"
                result = await client.call_tool("tools__echo", {"text": "alive"})
                assert result.content[0].text == "alive"  # type: ignore[union-attr]


async def test_session_delete_closes_only_its_upstream_sessions(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Ending one client session closes its upstream session and leaves another client's in use."""
    config = gateway_config(tmp_path, tools_upstream.url, era="session")
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        gateway = RunningGateway(url, app.state.gateway, tmp_path)
        async with gateway.client("bob") as bob:
            async with gateway.client() as alice:
                await alice.call_tool("tools__echo", {"text": "a"})
                await bob.call_tool("tools__echo", {"text": "b"})
                alice_up = next(
                    s for s in gateway.gateway.registry if s.agent == "alice"
                ).upstream_sessions.get("tools")
            # Alice's client has exited: DELETE sent, her upstream session is closed upstream.
            async with httpx.AsyncClient() as http:
                gone = await http.post(
                    tools_upstream.url,
                    headers={
                        "mcp-session-id": alice_up.session_id,
                        "mcp-protocol-version": alice_up.protocol_version,
                        "accept": "application/json, text/event-stream",
                    },
                    json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                )
            assert gone.status_code == 404
            result = await bob.call_tool("tools__echo", {"text": "bob still"})
    assert result.content[0].text == "bob still"  # type: ignore[union-attr]


async def test_stdio_upstream_is_stopped_on_shutdown(tmp_path: Path, tools_upstream: Upstream) -> None:
    """The process Bastion launched does not outlive the gateway."""
    snapshot = snapshot_from_mapping(gateway_config(tmp_path, tools_upstream.url), source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app):
        upstream = app.state.gateway.fleet.upstreams["notes"]
        assert isinstance(upstream, StdioUpstream)
        pid = upstream.pid
        assert pid is not None
        os.kill(pid, 0)  # alive while the gateway serves
    with anyio.fail_after(10):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            # A zombie still answers kill(0) until reaped; the gateway waits for it, so this is brief.
            await anyio.sleep(0.05)
