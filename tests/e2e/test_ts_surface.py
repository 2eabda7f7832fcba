"""The official TypeScript MCP client on Bastion's resources, prompts, completion and subscriptions (issue 9).

Session era, against the two colliding upstreams of ``tests/e2e/test_surface_e2e.py`` (``a``
over stdio, ``b`` over HTTP). Bob's grants hide ``doc://secret``. Installed and skipped as in
``tests/e2e/test_ts_client.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.e2e.conftest import TOKENS
from tests.e2e.test_surface_e2e import _config, _gateway, http_surface
from tests.e2e.test_ts_client import CLIENT_DIR, _node

pytestmark = pytest.mark.anyio

__all__ = ["http_surface"]  # the fixture, imported for pytest


async def test_typescript_client_lists_reads_gets_completes_and_subscribes(
    tmp_path: Path, http_surface: str
) -> None:
    """The TypeScript client pages the merged resources, reads, gets a prompt, completes, hears the
    update of the resource it subscribed to, and is told a hidden resource is not found."""
    node = _node()
    config = _config(http_surface)
    config["grants"].append({"agent": "bob", "servers": ["b"], "tools": ["touch"]})
    async with _gateway(tmp_path, config) as gateway:
        with anyio.fail_after(60):
            finished = await anyio.run_process(
                [node, str(CLIENT_DIR / "surface_client.mjs"), gateway.url, TOKENS["bob"]],
                cwd=CLIENT_DIR,
                check=False,
            )
    assert finished.returncode == 0, finished.stderr.decode()
    report = json.loads(finished.stdout.decode().strip().splitlines()[-1])
    assert report["subscribe"] is True
    assert report["resources"] == sorted(
        f"bastion://{label}/doc://{name}" for label in "ab" for name in ("readme", "notes/1")
    )
    assert report["pages"] == 3
    assert report["templates"] == ["bastion://a/doc://pages/{page}", "bastion://b/doc://pages/{page}"]
    assert report["read"] == "readme of b"
    assert report["prompts"] == ["a__greet", "b__greet"]
    assert report["prompt"] == "hello ts from a"
    assert report["completion"] == ["b-beta"]
    assert report["updated"] == ["bastion://b/doc://pages/ts"]
    assert report["reread"] == "page ts of b, edit 1"
    assert report["hidden"] == -32002
