"""Upstream calls reuse kept-alive connections (upstream/streamable_http.py, upstream/resume.py).

The upstream is the bundled example server (a real ``mcp`` SDK app) on a loopback socket,
seen through an ASGI wrapper that records each request's client port: one port per TCP
connection. A session-era upstream answers every call with an SSE stream; reading that
stream to its end hands the connection back to the pool, so ten sequential calls share one
connection instead of opening ten.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion.examples.counter import FileCounter
from bastion.examples.tools_server import build_app, build_server
from bastion.policy.snapshot import ServerSpec, UpstreamKind
from bastion.upstream.base import CallContext, UpstreamSessions
from bastion.upstream.http_client import UpstreamHttp
from bastion.upstream.streamable_http import HttpUpstream
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


class _PortsSeen:
    """ASGI middleware: the client port of every POST, in order (a session's GET stream holds its own)."""

    def __init__(self, app: ASGIApp, ports: list[int]) -> None:
        self.app, self.ports = app, ports

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("client") and scope["method"] == "POST":
            self.ports.append(scope["client"][1])
        await self.app(scope, receive, send)


@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_sequential_calls_share_one_kept_alive_connection(tmp_path: Path, era: str) -> None:
    """Ten calls in a row, each answered in full, reach the upstream over a single TCP connection."""
    ports: list[int] = []
    app = build_app(build_server(FileCounter(tmp_path / "counter")), host="127.0.0.1", json_response=False)
    app.add_middleware(_PortsSeen, ports=ports)
    with anyio.fail_after(30):
        async with (
            serve_on_loopback(app) as url,
            UpstreamHttp(read_timeout_s=10) as client,
            anyio.create_task_group() as tg,
        ):
            spec = ServerSpec(name="tools", namespace="tools", kind=UpstreamKind.HTTP, url=url, era=era)
            upstream = HttpUpstream(spec, client)
            await upstream.start(tg)
            ctx = CallContext(relay=None, client_capabilities={}, upstream_sessions=UpstreamSessions())
            ports.clear()
            for n in range(10):
                result = await upstream.call(
                    "tools/call", {"name": "echo", "arguments": {"text": f"t{n}"}}, ctx
                )
                assert result["content"][0]["text"] == f"t{n}"
            await upstream.aclose()
    assert len(ports) >= 10
    # The calls' POSTs (the handshake's may have gone on the connection the GET stream now holds).
    calls = ports[-10:]
    assert len(set(calls)) == 1, f"{len(set(calls))} connections for {len(calls)} calls"
