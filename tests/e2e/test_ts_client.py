"""The official TypeScript MCP client (``@modelcontextprotocol/sdk``) works through Bastion (session era).

It lists tools, gets progress for its own call and hears logs at the level it
set, from a real SDK upstream of both eras. The client is installed by
``tests/e2e/ts_client/install.sh`` (``.ci/run`` calls it); where it is not
installed the test is skipped, except under ``.ci/run`` (``BASTION_TS_CLIENT=required``), where that fails.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio
import pytest

from tests.e2e.conftest import TOKENS
from tests.e2e.era_support import era_upstream_url, gateway_for

pytestmark = pytest.mark.anyio

__all__ = ["era_upstream_url"]  # the fixture, imported for pytest

CLIENT_DIR = Path(__file__).parent / "ts_client"


def _node() -> str:
    node = shutil.which("node")
    installed = (CLIENT_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir()
    if node is None or not installed:
        if os.environ.get("BASTION_TS_CLIENT") == "required":
            pytest.fail("the TypeScript client is not installed: run tests/e2e/ts_client/install.sh")
        pytest.skip("the TypeScript client is not installed: run tests/e2e/ts_client/install.sh")
    return node


async def test_typescript_client_session_era(tmp_path: Path, era_upstream_url: str) -> None:
    """The TypeScript client lists tools, gets its progress and hears warning and error logs only."""
    node = _node()
    async with gateway_for(tmp_path, era_upstream_url, "auto") as gateway:
        with anyio.fail_after(60):
            finished = await anyio.run_process(
                [node, str(CLIENT_DIR / "session_client.mjs"), gateway.url, TOKENS["alice"]],
                cwd=CLIENT_DIR,
                check=False,
            )
    assert finished.returncode == 0, finished.stderr.decode()
    report = json.loads(finished.stdout.decode().strip().splitlines()[-1])
    assert report["protocolVersion"] == "2025-11-25"
    assert {"up__slow", "up__chatty", "up__echo", "up__regional"} <= set(report["tools"])
    assert report["progress"] == [1, 2, 3]
    assert report["slow"] == "done"
    assert report["levels"] == ["warning", "error"]
    assert report["chatty"] == "logged"
    assert report["echo"] == "from typescript"
