"""A client that never reads its stream must not stall a shared stdio upstream (issue 12, point 1).

Agent A calls ``flood`` on a stdio upstream with a progress token, over a raw
socket with a small receive buffer that it never reads: the progress
notifications fill the kernel's buffers. Meanwhile 16 other requests call
``echo`` on the same upstream process (A's own: sessionless requests of one
agent share its process); each must get its answer, and A's stream is cut
(the call cancelled upstream) instead of blocking the reader.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import pytest

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS
from tests.e2e.issue4_support import entries_with_event
from tests.e2e.test_transport_rules import MODERN, MODERN_META, headers, rpc
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

_EXECUTION = "exec-silent-reader-1"
_FLOOD = {"count": 3000, "size": 8192}  # about 24 MiB of progress: far past any socket buffer


@pytest.fixture
async def flood_gateway(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    config = {
        "gateway": {"upstream_timeout_s": 30.0},
        "servers": {"flood": {"command": sys.executable, "args": ["-m", "tests.e2e.flood_upstream"]}},
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    snapshot = snapshot_from_mapping(config, source=None, version="test")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        yield url, tmp_path / "data" / "bastion.db"


def _modern_headers(name: str) -> dict[str, str]:
    return headers("alice", **{"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": name})


def _open_silent_reader(url: str) -> socket.socket:
    """POST the flood call on a raw socket with a tiny receive buffer, and never read from it."""
    parts = urlsplit(url)
    body = json.dumps(
        rpc(
            "tools/call",
            {
                "name": "flood__flood",
                "arguments": _FLOOD,
                "_meta": {**MODERN_META, "progressToken": "p"},
                "_cmcp": {"execution_id": _EXECUTION},
            },
            1,
        )
    ).encode()
    head = {**_modern_headers("flood__flood"), "host": parts.netloc, "content-length": str(len(body))}
    request = f"POST {parts.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
    sock.sendall(request.encode() + body)
    return sock


def _read_to_end(sock: socket.socket) -> bytes:
    """Everything left on ``sock`` until the server ends the response (the last 64 KiB)."""
    sock.settimeout(30)
    tail = b""
    while not tail.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        tail = (tail + chunk)[-65536:]
    return tail


async def _echo(http: httpx.AsyncClient, url: str, index: int) -> str:
    body = rpc(
        "tools/call",
        {"name": "flood__echo", "arguments": {"text": f"client-{index}"}, "_meta": MODERN_META},
        index,
    )
    response = await http.post(url, headers=_modern_headers("flood__echo"), json=body)
    assert response.status_code == 200, response.text
    text = response.text
    payload = json.loads(text[text.index("{") :]) if not text.startswith("{") else response.json()
    return str(payload["result"]["content"][0]["text"])


async def test_a_client_that_never_reads_does_not_stall_others(flood_gateway: tuple[str, Path]) -> None:
    """While one client never reads its progress stream, 16 others' calls to its stdio upstream answer."""
    url, db_path = flood_gateway
    async with httpx.AsyncClient(timeout=60) as http:
        # Alice's own process (issue 22) is started first, so the flood is under way within the second.
        assert await _echo(http, url, 99) == "client-99"
    silent = _open_silent_reader(url)
    try:
        answers: dict[int, str] = {}
        async with httpx.AsyncClient(timeout=60) as http:
            # The flood is under way (and the silent socket's buffers full) before the others call.
            await anyio.sleep(1.0)

            async def one(index: int) -> None:
                answers[index] = await _echo(http, url, index)

            with anyio.fail_after(25):  # well under the 30 s upstream timeout a stalled reader would cost
                async with anyio.create_task_group() as tg:
                    for index in range(16):
                        tg.start_soon(one, index)
        assert answers == {index: f"client-{index}" for index in range(16)}
        # A's stream was cut, not finished: once A reads, it ends in outcome unknown, never the result.
        tail = await anyio.to_thread.run_sync(_read_to_end, silent)
        assert b"-32063" in tail and b"flooded" not in tail, tail[-400:]
        cut = [e for e in entries_with_event(db_path, "outcome_unknown") if e["execution_id"] == _EXECUTION]
        assert len(cut) == 1, cut
    finally:
        silent.close()
