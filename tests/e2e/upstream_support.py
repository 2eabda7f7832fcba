"""Shared by the upstream SSE end-to-end tests: an upstream program, and the SDK client through Bastion."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, _stop
from tests.support.loopback import serve_on_loopback


@contextlib.contextmanager
def listening_upstream(argv: Sequence[str]) -> Iterator[str]:
    """Run an upstream that prints ``LISTENING <url>`` once ready; yields the URL, stops it on exit."""
    process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("LISTENING "), f"{argv[-1]} did not start: {line!r}"
        yield line.split()[1]
    finally:
        _stop(process)


@contextlib.asynccontextmanager
async def client_through_bastion(
    tmp_path: Path, namespace: str, upstream_url: str, era: str = "auto"
) -> AsyncIterator[Client]:
    """A gateway with this one upstream, and the official client (session era) as alice."""
    config = {
        "servers": {namespace: {"url": upstream_url, "era": era}},
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


def text_of(result: object) -> str:
    """The text blocks of a tool result, joined."""
    return " ".join(b.text for b in getattr(result, "content", []) if isinstance(b, TextContent))
