"""Connection limits keep agents apart, not out (issue #22 point 6; transport/limits.py, agent_limits.py).

Before authentication an address may hold ``max_unauthenticated_connections_per_address``
connections being read, and a bounded number more waiting, unread, for a slot; a connection
leaves that pool when a request on it authenticates, and from then on the caps are the agent's
(``max_requests_per_agent``, refused with a readable 429). With the default configuration, 200
official-SDK clients on one address (directly, and behind the bundled nginx, where every
connection comes from nginx's address) all initialize and call a tool through ``bastion serve``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import httpx2
import pytest
from anyio.abc import SocketStream
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.transport.limits import WAITING_FACTOR, front_door_limits
from tests.e2e.conftest import TOKENS, Upstream
from tests.e2e.issue4_support import toml_dumps
from tests.e2e.replicas_support import NGINX, _free_port, _until_listening, nginx_config
from tests.e2e.test_workers_e2e import _stop, gateway_process
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

CAP = 4
CLIENTS = 200
_MODERN = "2026-07-28"


def _config(tools_url: str, **gateway: Any) -> dict[str, Any]:
    return {
        "gateway": {"upstream_timeout_s": 60.0, **gateway},
        "servers": {"tools": {"url": tools_url}},
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }


@contextlib.asynccontextmanager
async def _limited(
    tmp_path: Path, tools_url: str, trusted_proxies: tuple[str, ...] = (), **gateway: Any
) -> AsyncIterator[Any]:
    snapshot = snapshot_from_mapping(_config(tools_url, **gateway), source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    limits = front_door_limits(snapshot.gateway, trusted_proxies)
    async with serve_on_loopback(app, limits=limits) as url:
        yield url, app


async def _connect(url: str, local_host: str = "127.0.0.1") -> SocketStream:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return await anyio.connect_tcp(parts.hostname, parts.port, local_host=local_host)


async def _closed(stream: SocketStream) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    received = b""
    while True:
        try:
            received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
            return received


def _echo_body() -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": _MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "tools__echo", "arguments": {"text": "hi"}, "_meta": meta},
    }


def _headers(url: str, agent: str) -> dict[str, str]:
    return {
        "host": urlsplit(url).netloc,
        "authorization": f"Bearer {TOKENS[agent]}",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": _MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "tools__echo",
    }


async def test_a_connection_past_the_unauthenticated_cap_waits_and_is_then_served(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Past the cap a connection is not cut: it waits unread, and is served once a slot frees."""
    async with _limited(
        tmp_path, tools_upstream.url, max_unauthenticated_connections_per_address=CAP, header_timeout_s=5.0
    ) as (url, _):
        held = [await _connect(url) for _ in range(CAP)]
        extra = await _connect(url)
        await extra.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        with anyio.move_on_after(0.3):
            early = await extra.receive()
            pytest.fail(f"a waiting connection was read: {early!r}")
        await held.pop().aclose()
        with anyio.fail_after(10):
            answer = await _closed(extra)
        await extra.aclose()
        for stream in held:
            await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 200 ")


async def test_a_trusted_proxys_connections_are_not_counted_per_address(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A trusted proxy carries many clients: its idle connections take no slot; one untrusted waits."""
    async with _limited(
        tmp_path,
        tools_upstream.url,
        trusted_proxies=("127.0.0.1",),
        max_unauthenticated_connections_per_address=1,
        header_timeout_s=5.0,
    ) as (url, _):
        held = [await _connect(url) for _ in range(3)]
        served = await _connect(url)
        await served.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        with anyio.fail_after(2):  # read at once, well before the 5 s header deadline
            answer = await _closed(served)
        await served.aclose()
        first = await _connect(url, local_host="127.0.0.2")
        second = await _connect(url, local_host="127.0.0.2")
        await second.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        with anyio.move_on_after(0.3):
            early = await second.receive()
            pytest.fail(f"a connection past an untrusted address's cap was read: {early!r}")
        for stream in (*held, first, second):
            await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 200 ")


async def test_an_unauthenticated_flood_from_one_address_is_bounded(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """One address holds at most the cap plus its waiting bound; past it a connection is closed at once,
    every one of them is closed at the header deadline, and another address's agent is served meanwhile."""
    async with _limited(
        tmp_path, tools_upstream.url, max_unauthenticated_connections_per_address=CAP, header_timeout_s=3.0
    ) as (url, _):
        flood = [await _connect(url) for _ in range(CAP + CAP * WAITING_FACTOR)]
        past = await _connect(url)
        with anyio.fail_after(1.5):  # well before the 3 s header deadline: refused at once
            assert await _closed(past) == b""
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with httpx.AsyncClient(transport=transport, timeout=10) as http:
            served = await http.post(url, json=_echo_body(), headers=_headers(url, "alice"))
        with anyio.fail_after(15):  # read (or waiting) unauthenticated: cut at the header deadline
            cut = [await _closed(stream) for stream in flood]
        await past.aclose()
        for stream in flood:
            await stream.aclose()
    assert served.status_code == 200 and "hi" in served.text
    assert cut == [b""] * len(flood)


async def test_an_agent_past_its_cap_gets_a_readable_429(
    tmp_path: Path, tools_upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    """Past max_requests_per_agent an agent is answered 429 with a JSON-RPC error and a log line;
    another agent on the same address is served."""
    async with (
        _limited(tmp_path, tools_upstream.url, max_requests_per_agent=2) as (url, app),
        httpx.AsyncClient(timeout=30) as http,
    ):
        front = app.state.front
        slow = {**_echo_body(), "params": {**_echo_body()["params"], "name": "tools__slow"}}
        slow["params"]["arguments"] = {"seconds": 3, "steps": 1}
        slow_headers = {**_headers(url, "alice"), "mcp-name": "tools__slow"}
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(lambda: http.post(url, json=slow, headers=slow_headers))
            with anyio.fail_after(10):
                while front.agent_requests.in_progress("alice") < 2:
                    await anyio.sleep(0.02)
            with caplog.at_level(logging.WARNING, logger="bastion.transport.agent_limits"):
                refused = await http.post(url, json=_echo_body(), headers=_headers(url, "alice"))
            other = await http.post(url, json=_echo_body(), headers=_headers(url, "bob"))
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["data"] == {"reason": "agent_request_limit", "limit": 2}
    assert other.status_code == 200 and "hi" in other.text
    (line,) = [r for r in caplog.records if getattr(r, "reason", None) == "agent_request_limit"]
    assert line.agent == "alice" and line.client == "127.0.0.1"  # type: ignore[attr-defined]


async def _many_clients(url: str, count: int) -> list[str]:
    """``count`` official SDK clients, all at once: each initializes, then (all sessions open) calls echo."""
    initialized = 0
    all_open = anyio.Event()
    texts: list[str] = []

    async def one(n: int) -> None:
        nonlocal initialized
        headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            initialized += 1
            if initialized == count:
                all_open.set()
            await all_open.wait()
            result = await client.call_tool("tools__echo", {"text": f"c{n}"})
            texts.append(str(result.content[0].text))  # type: ignore[union-attr]

    with anyio.fail_after(300):
        async with anyio.create_task_group() as tg:
            for n in range(count):
                tg.start_soon(one, n)
    return texts


@contextlib.asynccontextmanager
async def _serve_default(tmp_path: Path, tools_url: str) -> AsyncIterator[str]:
    """``bastion serve`` with the default limits (allowed_hosts admits nginx's port, no limit changed)."""
    config = tmp_path / "gateway.toml"
    config.write_text(toml_dumps(_config(tools_url, allowed_hosts=["127.0.0.1:*"])))
    async with gateway_process(config, tmp_path / "data", "gateway-1", tmp_path / "gateway.log") as gateway:
        yield gateway.url


async def test_200_sdk_clients_on_one_address_all_connect_and_call(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """With the default configuration, 200 concurrent official clients from 127.0.0.1 all initialize and
    call a tool (before issue #22 the 65th connection was closed unread)."""
    async with _serve_default(tmp_path, tools_upstream.url) as url:
        texts = await _many_clients(url, CLIENTS)
    assert sorted(texts) == sorted(f"c{n}" for n in range(CLIENTS))


async def test_200_sdk_clients_behind_the_bundled_nginx_all_connect_and_call(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Behind deploy/nginx/bastion.conf (every connection from nginx's address), default limits:
    all 200 call."""
    if NGINX is None:
        pytest.fail("nginx is not installed (.ci/run installs Debian's nginx)")
    async with _serve_default(tmp_path, tools_upstream.url) as direct:
        port = int(urlsplit(direct).port or 0)
        listen = _free_port()
        prefix = tmp_path / "nginx"
        # The deploy file's three replicas, all this one gateway: the proxy is the shipped one.
        conf = nginx_config(prefix, [port, port, port], listen)
        nginx = await anyio.open_process([NGINX, "-p", str(prefix), "-c", str(conf)], cwd=prefix)
        try:
            await _until_listening(listen, nginx, prefix / "logs" / "error.log")
            texts = await _many_clients(f"http://127.0.0.1:{listen}/mcp", CLIENTS)
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(nginx)
    assert sorted(texts) == sorted(f"c{n}" for n in range(CLIENTS))
