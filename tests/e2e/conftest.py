"""End-to-end fixtures: real upstream subprocesses, a real gateway on a loopback socket.

The example HTTP upstream runs once per test session (it is stateless between
tests except for its counter file, which each test reads relatively). Each
test gets its own gateway, launching its own stdio notes server.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import Gateway, RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.support.loopback import serve_on_loopback

SESSIONLESS_MAX_AGE_S = 0.5
TOKENS = {"alice": "alice-token-" + "a" * 32, "bob": "bob-token-" + "b" * 32}


@dataclass
class Upstream:
    url: str
    counter_file: Path
    process: subprocess.Popen[str]


def _start_tools_server(counter_file: Path, *extra: str) -> Upstream:
    env = {**os.environ, "BASTION_COUNTER_FILE": str(counter_file)}
    process = subprocess.Popen(
        [sys.executable, "-m", "bastion.examples.tools_server", "--host", "127.0.0.1", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("LISTENING "), f"tools server did not start: {line!r}"
    return Upstream(line.split()[1], counter_file, process)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    if process.stdout is not None:
        process.stdout.close()


@pytest.fixture(scope="session")
def tools_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    upstream = _start_tools_server(tmp_path_factory.mktemp("tools") / "counter.log")
    yield upstream
    _stop(upstream.process)


@pytest.fixture
def fresh_tools_upstream(tmp_path: Path) -> Iterator[Upstream]:
    """An HTTP upstream of this test's own, for tests that kill it."""
    upstream = _start_tools_server(tmp_path / "own-counter.log")
    yield upstream
    _stop(upstream.process)


def gateway_config(
    tmp_path: Path, tools_url: str, *, era: str = "auto", timeout_s: float = 20.0, **gateway: Any
) -> dict[str, Any]:
    return {
        "gateway": {"upstream_timeout_s": timeout_s, **gateway},
        "servers": {
            "notes": {
                "command": sys.executable,
                "args": ["-m", "bastion.examples.notes_server"],
                "env": {
                    "BASTION_NOTES_FILE": str(tmp_path / "notes.jsonl"),
                    "BASTION_COUNTER_FILE": str(tmp_path / "notes-counter.log"),
                },
            },
            "tools": {"url": tools_url, "era": era},
        },
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }


@dataclass
class RunningGateway:
    url: str
    gateway: Gateway
    tmp_path: Path

    @contextlib.asynccontextmanager
    async def client(
        self, agent: str = "alice", *, mode: str = "legacy", **kwargs: Any
    ) -> AsyncIterator[Client]:
        """The official SDK client, authenticated as ``agent``."""
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS[agent]}"}, timeout=30) as http,
            Client(streamable_http_client(self.url, http_client=http), mode=mode, **kwargs) as client,
        ):
            yield client

    def raw(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=30)


@pytest.fixture
async def running_gateway(tmp_path: Path, tools_upstream: Upstream) -> AsyncIterator[RunningGateway]:
    snapshot = snapshot_from_mapping(
        gateway_config(tmp_path, tools_upstream.url), source=None, version="test"
    )
    # A short age bound: the chain sessionless requests share closes, claim issued, within a second.
    options = RuntimeOptions(data_dir=tmp_path / "data", sessionless_evidence_max_age_s=SESSIONLESS_MAX_AGE_S)
    app = create_app(snapshot, options)
    async with serve_on_loopback(app) as url:
        yield RunningGateway(url, app.state.gateway, tmp_path)


def counter_value(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0
