"""Headers that decide something come once: duplicates are 400 (issue #22 point 5, single_headers.py).

With two ``Mcp-Name`` (or ``Mcp-Method``) headers only the last was compared with the body, so an
intermediary reading the first could be steered past; with two ``Origin`` or ``Host`` headers the
first won. Each is now refused before anything reads it, over a real socket (uvicorn), in both eras.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

_MODERN = "2026-07-28"


@pytest.fixture
async def front(tmp_path: Path, tools_upstream: Upstream) -> AsyncIterator[str]:
    config = {
        "servers": {"tools": {"url": tools_upstream.url}},
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(tmp_path / "data")
    )
    async with serve_on_loopback(app) as url:
        yield url


def _echo(url: str, era: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    authority = urlsplit(url).netloc
    headers = [
        ("host", authority),
        ("origin", f"http://{authority}"),
        ("authorization", f"Bearer {TOKENS['alice']}"),
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ]
    if era == "sessionless":
        meta = {
            "io.modelcontextprotocol/protocolVersion": _MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "tools__echo", "arguments": {"text": "hi"}, "_meta": meta},
        }
        headers += [
            ("mcp-protocol-version", _MODERN),
            ("mcp-method", "tools/call"),
            ("mcp-name", "tools__echo"),
        ]
    else:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
    return body, headers


async def _post(url: str, body: dict[str, Any], headers: list[tuple[str, str]]) -> tuple[int, Any]:
    """POST over a raw socket: HTTP clients (h11) refuse to send a second Host, a proxy may not."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = [f"POST {parts.path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    head += [f"content-length: {len(payload)}", "connection: close"]
    with anyio.fail_after(30):
        async with await anyio.connect_tcp(parts.hostname or "127.0.0.1", parts.port or 80) as stream:
            await stream.send("\r\n".join(head).encode() + b"\r\n\r\n" + payload)
            received = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    received += await stream.receive()
    status_line, _, rest = received.partition(b"\r\n")
    response_head, _, response_body = rest.partition(b"\r\n\r\n")
    if b"text/event-stream" in response_head.lower():
        lines = [line[5:] for line in response_body.splitlines() if line.startswith(b"data:")]
        response_body = lines[-1]
    return int(status_line.split()[1]), json.loads(response_body)


@pytest.mark.parametrize("era", ["sessionless", "session"])
async def test_a_request_with_each_header_once_is_served(front: str, era: str) -> None:
    """The control: the same request, every header once, is answered 200."""
    body, headers = _echo(front, era)
    status, reply = await _post(front, body, headers)
    assert status == 200, reply
    assert "result" in reply


@pytest.mark.parametrize(
    ("era", "name", "second"),
    [
        pytest.param("sessionless", "mcp-name", "tools__other", id="mcp-name"),
        pytest.param("sessionless", "mcp-method", "tools/list", id="mcp-method"),
        pytest.param("sessionless", "mcp-name", None, id="mcp-name-same-value"),
        pytest.param("sessionless", "origin", None, id="origin"),
        pytest.param("session", "origin", "http://evil.example", id="origin-foreign-second"),
        pytest.param("session", "host", None, id="host"),
        pytest.param("sessionless", "host", "evil.example", id="host-foreign-second"),
    ],
)
async def test_a_duplicated_deciding_header_is_400(
    front: str, era: str, name: str, second: str | None
) -> None:
    """Two Mcp-Name, Mcp-Method, Origin or Host headers: 400 ``duplicate_header``, naming the header."""
    body, headers = _echo(front, era)
    first = next(value for key, value in headers if key == name)
    status, reply = await _post(front, body, [*headers, (name, second if second is not None else first)])
    assert status == 400, reply
    assert reply["error"]["data"] == {"reason": "duplicate_header", "header": name}
