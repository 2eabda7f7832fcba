"""The upstream HTTP client keeps no cookies (upstream/http_client.py): one pool serves every client.

An upstream's ``Set-Cookie`` answered to one client's call must never ride on another
client's call: the pool is shared by every session of the gateway, so a cookie jar would be
state crossing between clients. The upstream here is a real ASGI app on a loopback socket
that sets a cookie on every answer and echoes the ``Cookie`` header it received.
"""

from __future__ import annotations

import anyio
import pytest
from starlette.types import Receive, Scope, Send

from bastion.upstream.http_client import UpstreamHttp
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


async def _cookie_echo(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    cookie = dict(scope["headers"]).get(b"cookie", b"")
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"set-cookie", b"sid=from-upstream; Path=/")],
        }
    )
    await send({"type": "http.response.body", "body": b"cookie=" + cookie})


async def test_a_cookie_set_by_an_upstream_is_never_sent_back() -> None:
    """The second request carries no Cookie header although the first answer set one."""
    with anyio.fail_after(30):
        async with serve_on_loopback(_cookie_echo) as served, UpstreamHttp(read_timeout_s=10) as client:
            # A host name, not an address: a default cookie jar keeps cookies only for names.
            url = served.replace("127.0.0.1", "localhost")
            async with client.stream("POST", url, headers={}, content=b"{}") as first:
                assert first.headers.get("set-cookie", "").startswith("sid=")
                assert await first.aread() == b"cookie="
            async with client.stream("POST", url, headers={}, content=b"{}") as second:
                assert await second.aread() == b"cookie="
