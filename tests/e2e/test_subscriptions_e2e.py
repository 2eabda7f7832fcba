"""Resource subscriptions through Bastion (issue 9), official Python client in both eras.

The upstreams are ``tests/e2e/surface_upstream.py``: ``a`` a stdio process (one session shared
by every client, so Bastion counts subscribers), ``b`` over HTTP (a session-era client gets its
own upstream session there, and subscribes on it). Their tool ``touch`` changes one page and
tells exactly the upstream sessions (and listen streams) subscribed to it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp.types import TextContent

from bastion.upstream.stdio import StdioUpstream
from tests.e2e.conftest import RunningGateway
from tests.e2e.test_surface_e2e import _config, _entries_of, _gateway, http_surface  # noqa: F401

# resources/subscribe is the session era's method; the SDK marks it deprecated for 2026.
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

SESSIONS = 32


def _shared_config(http_surface: str) -> dict[str, Any]:  # noqa: F811
    """The surface servers, stdio ``a`` declared stateless: one process, its subscriptions counted
    (issue 22: the operator's explicit ``scope = "shared"``; an owned process holds its own)."""
    config = _config(http_surface)
    config["servers"]["a"]["scope"] = "shared"
    return config


@pytest.fixture
async def gateway(tmp_path: Path, http_surface: str) -> AsyncIterator[RunningGateway]:  # noqa: F811
    async with _gateway(tmp_path, _shared_config(http_surface)) as running:
        yield running


class Updates:
    """The resources/updated notifications one client session received, in order."""

    def __init__(self) -> None:
        self.uris: list[str] = []
        self.changed = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            self.uris.append(str(message.params.uri))
            self.changed.set()
            self.changed = anyio.Event()

    async def until(self, uri: str) -> None:
        with anyio.fail_after(30):
            while uri not in self.uris:
                await self.changed.wait()


async def _count(client: Client, server: str, page: str) -> int:
    result = await client.call_tool(f"{server}__subscribers", {"page": page})
    content = result.content[0]
    assert isinstance(content, TextContent), result
    return int(content.text)


async def _touch(client: Client, server: str, page: str) -> None:
    result = await client.call_tool(f"{server}__touch", {"page": page})
    assert not result.is_error, result


@pytest.mark.parametrize("server", ["a", "b"])
async def test_32_sessions_each_hear_exactly_their_own_resource_and_the_shared_one(
    gateway: RunningGateway, server: str
) -> None:
    """32 concurrent sessions subscribe to their own page and to one shared page: every update
    reaches exactly its subscribers, never another session; leaving releases the upstream
    subscription (stdio: one shared subscription, counted; HTTP: one per client session)."""
    updates = [Updates() for _ in range(SESSIONS)]
    shared_uri = f"bastion://{server}/doc://pages/all"
    subscribed = [anyio.Event() for _ in range(SESSIONS)]
    heard = anyio.Event()
    leave = anyio.Event()
    unsubscribed = [anyio.Event() for _ in range(SESSIONS)]
    left = 0

    async def session(i: int) -> None:
        nonlocal left
        async with gateway.client(message_handler=updates[i].on_message) as client:
            await client.subscribe_resource(f"bastion://{server}/doc://pages/{i}")
            await client.subscribe_resource(shared_uri)
            subscribed[i].set()
            await updates[i].until(shared_uri)
            left += 1
            if left == SESSIONS:
                heard.set()
            await leave.wait()
            if i % 2 == 0:
                await client.unsubscribe_resource(shared_uri)
            unsubscribed[i].set()
            await leave.wait()

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg, gateway.client() as driver:
            for i in range(SESSIONS):
                tg.start_soon(session, i)
            for event in subscribed:
                await event.wait()
            # stdio: one process, one shared upstream subscription; HTTP: each client its own session.
            assert await _count(driver, server, "all") == (1 if server == "a" else SESSIONS)
            for i in range(SESSIONS):
                await _touch(driver, server, str(i))
            await _touch(driver, server, "all")  # ordered after every page's update on each stream
            await heard.wait()
            for i, got in enumerate(updates):
                assert got.uris == [f"bastion://{server}/doc://pages/{i}", shared_uri], i
            leave.set()
            for event in unsubscribed:
                await event.wait()
            assert await _count(driver, server, "all") == (1 if server == "a" else SESSIONS // 2)
            tg.cancel_scope.cancel()
    assert gateway.gateway.router is not None
    subscriptions = gateway.gateway.router.subscriptions
    with anyio.fail_after(10):
        while subscriptions.subscribers(server, "doc://pages/all"):
            await anyio.sleep(0.05)
    if server == "a":
        async with gateway.client() as driver:
            assert await _count(driver, "a", "all") == 0  # the last one out unsubscribed upstream


async def test_a_hidden_resource_cannot_be_subscribed_and_is_audited(gateway: RunningGateway) -> None:
    """Bob's grants hide doc://secret: subscribing is refused exactly as for an unknown URI, audited."""
    async with gateway.client("bob") as client:
        with pytest.raises(MCPError) as hidden:
            await client.subscribe_resource("bastion://a/doc://secret")
        with pytest.raises(MCPError) as unknown:
            await client.subscribe_resource("bastion://nobody/doc://secret")
        await client.subscribe_resource("bastion://a/doc://readme")
    assert hidden.value.error.code == unknown.value.error.code == -32002
    entries = [
        e for e in _entries_of(gateway.tmp_path, "bob") if e["detail"].get("method") == "resources/subscribe"
    ]
    assert {(e["tool"], e["reason"]) for e in entries if e["decision"] == "deny"} == {
        ("doc://secret", "grant_denied"),
        (None, "unknown_resource"),
    }
    assert [e["tool"] for e in entries if e["event"] == "completed"] == ["doc://readme"]


# a: stdio (scope shared); b: both eras (the upstream's own listen stream, shared), pinned session era
# (the listen stream gets its own upstream session and follows its GET stream), pinned sessionless.
@pytest.mark.parametrize(
    ("server", "era"), [("a", "auto"), ("b", "auto"), ("b", "session"), ("b", "sessionless")]
)
async def test_a_listen_stream_hears_only_the_resources_it_named_and_may_see(
    tmp_path: Path,
    http_surface: str,  # noqa: F811
    era: str,
    server: str,
) -> None:
    """A 2026 client's listen stream names its URIs: hidden ones are left out of the acknowledgment,
    and an update reaches the stream that named that URI, not another listening client."""
    config = _shared_config(http_surface)
    if era != "auto":
        config["servers"]["b"]["era"] = era  # b's updates then come on a listen stream Bastion holds
    mine = f"bastion://{server}/doc://pages/1"
    theirs = f"bastion://{server}/doc://pages/2"
    async with (
        _gateway(tmp_path, config) as running,
        running.client("bob", mode="auto") as client,
        running.client("alice", mode="auto") as other,
        client.listen(resource_subscriptions=[mine, f"bastion://{server}/doc://secret"]) as subscription,
        other.listen(resource_subscriptions=[theirs]) as other_subscription,
    ):
        assert subscription.honored.resource_subscriptions == [mine]
        assert other_subscription.honored.resource_subscriptions == [theirs]
        await _touch(other, server, "2")
        await _touch(other, server, "1")
        with anyio.fail_after(30):
            event = await subscription.__anext__()
            other_event = await other_subscription.__anext__()
    assert event == ResourceUpdated(uri=mine)
    assert other_event == ResourceUpdated(uri=theirs)
    entries = [e for e in _entries_of(tmp_path, "bob") if e["detail"].get("method") == "subscriptions/listen"]
    assert {(e["tool"], e["decision"], e["reason"]) for e in entries if e["event"] == "refused"} == {
        ("doc://secret", "deny", "grant_denied")
    }


async def test_a_restarted_stdio_upstream_is_subscribed_again(gateway: RunningGateway) -> None:
    """The stdio process dies and comes back knowing no subscription: Bastion makes the ones it
    holds again, so the session still hears its resource's updates."""
    upstream = gateway.gateway.fleet.upstreams["a"]
    assert isinstance(upstream, StdioUpstream)
    updates = Updates()
    uri = "bastion://a/doc://pages/kept"
    async with gateway.client(message_handler=updates.on_message) as client:
        await client.subscribe_resource(uri)
        first_pid = upstream.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        with anyio.fail_after(30):
            while upstream.pid == first_pid or not upstream.health().connected:
                await anyio.sleep(0.05)
            while await _count(client, "a", "kept") != 1:  # made again in the background
                await anyio.sleep(0.05)
        await _touch(client, "a", "kept")
        await updates.until(uri)
    assert updates.uris == [uri]


async def test_an_owned_stdio_process_updates_only_its_own_subscriber(
    tmp_path: Path,
    http_surface: str,  # noqa: F811
) -> None:
    """With a process per client session (the default, issue 22), two sessions subscribe to the
    same page on stdio ``a``, each on its own process: a change one session makes on its process
    reaches it and not the other, whose process never changed."""
    uri = "bastion://a/doc://pages/same"
    mine, theirs = Updates(), Updates()
    async with (
        _gateway(tmp_path, _config(http_surface)) as running,
        running.client(message_handler=mine.on_message) as alice,
        running.client(message_handler=theirs.on_message) as other,
    ):
        await alice.subscribe_resource(uri)
        await other.subscribe_resource(uri)
        assert await _count(alice, "a", "same") == 1  # one subscriber on each process, not two
        await _touch(alice, "a", "same")
        await mine.until(uri)
        await _touch(other, "a", "same")
        await theirs.until(uri)
    assert mine.uris == [uri] and theirs.uris == [uri]
