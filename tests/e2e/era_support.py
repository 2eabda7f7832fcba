"""Shared by the era-pairing tests: the two-era upstream process and a gateway in front of it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, RunningGateway, _stop
from tests.support.loopback import serve_on_loopback

__all__ = ["REPO", "era_upstream_url", "gateway_for"]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def era_upstream_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    counter = tmp_path_factory.mktemp("era") / "counter.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.era_upstream"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "BASTION_COUNTER_FILE": str(counter)},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("LISTENING "), line
    yield line.split()[1]
    _stop(process)


@contextlib.asynccontextmanager
async def gateway_for(tmp_path: Path, url: str, upstream_era: str) -> AsyncIterator[RunningGateway]:
    config = {
        "gateway": {"upstream_timeout_s": 20.0},
        "servers": {"up": {"url": url, "era": upstream_era}},
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    snapshot = snapshot_from_mapping(config, source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as front:
        yield RunningGateway(front, app.state.gateway, tmp_path)
