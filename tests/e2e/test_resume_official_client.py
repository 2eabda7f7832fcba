"""The official client resumes a dropped response stream through Bastion (issue 8 point 7, client side).

A small TCP relay between the client and the gateway cuts the connection once,
right after the first progress event of a call; the client then reconnects by
itself (GET with ``Last-Event-ID``) and must get the rest of the call: every
progress step once and the result.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream, gateway_config
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


class CuttingRelay:
    """Relays TCP to the gateway; the first response chunk with a progress event ends its connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cuts = 0

    async def serve(self, listener: anyio.abc.SocketListener) -> None:
        await listener.serve(self._relay)

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        async with (
            client,
            await anyio.connect_tcp("127.0.0.1", self.target_port) as server,
            anyio.create_task_group() as tg,
        ):

            async def upstream() -> None:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    async for chunk in client:
                        await server.send(chunk)
                tg.cancel_scope.cancel()

            async def downstream() -> None:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    async for chunk in server:
                        await client.send(chunk)
                        if self.cuts == 0 and b"notifications/progress" in chunk:
                            self.cuts += 1
                            break  # the connection drops mid-response
                tg.cancel_scope.cancel()

            tg.start_soon(upstream)
            tg.start_soon(downstream)


@contextlib.asynccontextmanager
async def relayed_gateway(tmp_path: Path, upstream: Upstream) -> AsyncIterator[tuple[str, CuttingRelay]]:
    # The client reaches the gateway through the relay's port, so its Host names that port.
    config = gateway_config(tmp_path, upstream.url, allowed_hosts=["127.0.0.1:*"])
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path / "d")
    )
    async with serve_on_loopback(app) as url:
        port = urlsplit(url).port
        assert port is not None
        relay = CuttingRelay(port)
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        relay_port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(relay.serve, listener)
            yield f"http://127.0.0.1:{relay_port}/mcp", relay
            tg.cancel_scope.cancel()


async def test_official_client_resumes_a_dropped_call_stream(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """The connection drops after progress step 1; the client resumes and gets steps 2-4 and the result."""
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with (
        relayed_gateway(tmp_path, tools_upstream) as (url, relay),
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS['alice']}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        with anyio.fail_after(30):
            result = await client.call_tool(
                "tools__slow", {"seconds": 2.0, "steps": 4}, progress_callback=on_progress
            )
    assert relay.cuts == 1
    assert progress == [1, 2, 3, 4]
    assert result.content[0].text == "done"  # type: ignore[union-attr]
