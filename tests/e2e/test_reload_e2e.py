"""Policy reload end to end (issue #4, DESIGN section 8): the last valid snapshot stays in force.

A real gateway built from a TOML file on a loopback socket, with the real
upstreams. A reload (``POST /admin/reload`` with the admin credential, or
SIGHUP to a real ``bastion serve`` process) validates the whole file first;
a file that fails is not activated, the snapshot in force keeps deciding
calls, and ``/readyz`` (and the metrics) say why until a valid file arrives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import Upstream
from tests.e2e.issue4_support import (
    ADMIN_TOKEN,
    WAIT_S,
    answer_of,
    base_config,
    bearer,
    call,
    file_gateway,
    open_session,
    readyz,
    reason_of,
    reload_policy,
    sdk_client,
    static_token,
    toml_dumps,
    write_config,
)

pytestmark = pytest.mark.anyio

ALICE = static_token("alice")
BIN = Path(sys.executable).parent


def config(tmp_path: Path, tools_url: str, *tools: str) -> dict[str, Any]:
    """alice may call exactly ``tools`` of the tools server."""
    return {
        **base_config(tmp_path, tools_url),
        "grants": [{"name": "alice-tools", "agent": "alice", "servers": ["tools"], "tools": list(tools)}],
    }


def syntax_error(valid: dict[str, Any]) -> str:
    return toml_dumps(valid) + "\n[[grants]\nname = 'broken'\n"


def unknown_server(valid: dict[str, Any]) -> str:
    grant = {"name": "to-nowhere", "agent": "alice", "servers": ["nope"], "tools": ["*"]}
    return toml_dumps({**valid, "grants": [*valid["grants"], grant]})


def bad_schema(valid: dict[str, Any]) -> str:
    grant = {
        "name": "bad-schema",
        "agent": "alice",
        "servers": ["tools"],
        "tools": ["count"],
        "arguments_schema": {"type": "object", "properties": {"n": {"type": "integr"}}},
    }
    return toml_dumps({**valid, "grants": [*valid["grants"], grant]})


def adds_anonymous(valid: dict[str, Any]) -> str:
    # Only `bastion serve` knows whether the bind is loopback, so a reload may not admit one.
    return toml_dumps({**valid, "agents": {**valid["agents"], "suite": {"anonymous": True}}})


INVALID: list[Any] = [
    pytest.param(syntax_error, "TOML syntax error", id="syntax-error"),
    pytest.param(unknown_server, "unknown server 'nope'", id="unknown-server-in-grant"),
    pytest.param(bad_schema, "is not a valid JSON Schema", id="bad-json-schema"),
    pytest.param(adds_anonymous, "the anonymous agent changed", id="adds-an-anonymous-agent"),
]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def decisions(client: Client) -> dict[str, str | None]:
    """What the snapshot in force decides for alice's ``echo`` and ``count``: None (ran) or the reason."""
    seen: dict[str, str | None] = {}
    for tool, arguments in (("tools__echo", {"text": "x"}), ("tools__count", {})):
        try:
            await client.session.call_tool(tool, arguments)
            seen[tool] = None
        except MCPError as exc:
            seen[tool] = (exc.error.data or {}).get("reason")
    return seen


async def reload_failing_metric(http: httpx.AsyncClient, origin: str) -> float:
    metrics = (await http.get(f"{origin}/metrics")).text
    [line] = [m for m in metrics.splitlines() if m.startswith("bastion_policy_reload_failing ")]
    return float(line.split()[1])


@pytest.mark.parametrize(("break_file", "problem"), INVALID)
async def test_invalid_reload_keeps_the_last_valid_snapshot_and_readiness_says_why(
    tmp_path: Path,
    tools_upstream: Upstream,
    http: httpx.AsyncClient,
    break_file: Callable[[dict[str, Any]], str],
    problem: str,
) -> None:
    """An invalid file is refused (422, named); calls keep their decisions; /readyz says why until fixed."""
    path = tmp_path / "bastion.toml"
    valid = config(tmp_path, tools_upstream.url, "echo")
    version_a = write_config(path, valid)
    async with file_gateway(path, tmp_path / "data") as gw, sdk_client(gw.url, ALICE) as client:
        assert await decisions(client) == {"tools__echo": None, "tools__count": "unknown_tool"}

        path.write_text(break_file(valid))
        refused = await reload_policy(http, gw.origin)
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["error"]["reason"] == "config_invalid"
        assert problem in body["error"]["message"] and str(path) in body["error"]["message"]
        assert body["policy_version"] == version_a

        # The last valid snapshot stays in force, on the open session and on a new one.
        assert await decisions(client) == {"tools__echo": None, "tools__count": "unknown_tool"}
        async with sdk_client(gw.url, ALICE) as fresh:
            assert await decisions(fresh) == {"tools__echo": None, "tools__count": "unknown_tool"}
        status, ready = await readyz(http, gw.origin)
        assert ready["policy_version"] == version_a
        assert problem in ready["policy_reload_error"]["message"]
        assert ready["policy_reload_error"]["source"] == str(path)
        # As the code reports it: still ready (the last valid snapshot serves), with the failure shown.
        assert status == 200 and ready["ready"] is True
        assert await reload_failing_metric(http, gw.origin) == 1.0

        # A later valid file clears the failure and its decisions take over.
        version_c = write_config(path, config(tmp_path, tools_upstream.url, "echo", "count"))
        accepted = await reload_policy(http, gw.origin)
        assert accepted.status_code == 200, accepted.text
        status, ready = await readyz(http, gw.origin)
        assert status == 200 and ready["policy_version"] == version_c != version_a
        assert ready["policy_reload_error"] is None
        assert await reload_failing_metric(http, gw.origin) == 0.0
        assert await decisions(client) == {"tools__echo": None, "tools__count": None}


async def test_reload_needs_the_admin_credential(
    tmp_path: Path, tools_upstream: Upstream, http: httpx.AsyncClient
) -> None:
    """``POST /admin/reload`` without the admin token (or with an agent's) changes nothing: 401."""
    path = tmp_path / "bastion.toml"
    version_a = write_config(path, config(tmp_path, tools_upstream.url, "echo"))
    async with file_gateway(path, tmp_path / "data") as gw:
        write_config(path, config(tmp_path, tools_upstream.url, "echo", "count"))
        anonymous = await http.post(f"{gw.origin}/admin/reload")
        as_agent = await http.post(f"{gw.origin}/admin/reload", headers=bearer(ALICE))
        _, ready = await readyz(http, gw.origin)
    assert anonymous.status_code == 401 and as_agent.status_code == 401
    assert ready["policy_version"] == version_a


# ---------------------------------------------------------------- SIGHUP to a real `bastion serve`


class ServeProcess:
    """``bastion serve --config FILE`` as a child process; its log goes to a file."""

    def __init__(self, config_path: Path, data_dir: Path, log_path: Path) -> None:
        self.log = log_path.open("w")
        self.process = subprocess.Popen(
            [str(BIN / "bastion"), "serve", "--config", str(config_path), "--port", "0",
             "--data-dir", str(data_dir), "--log-level", "info"],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self.url = ""

    async def ready(self) -> str:
        assert self.process.stdout is not None
        with anyio.fail_after(WAIT_S):
            while True:
                line = await anyio.to_thread.run_sync(self.process.stdout.readline, abandon_on_cancel=True)
                assert line, "bastion serve exited before it was ready"
                if line.startswith("BASTION READY "):
                    self.url = line.split()[2]
                    return self.url

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


async def wait_for_version(http: httpx.AsyncClient, origin: str, version: str) -> dict[str, Any]:
    with anyio.fail_after(WAIT_S):
        while True:
            _, ready = await readyz(http, origin)
            if ready["policy_version"] == version:
                return ready
            await anyio.sleep(0.05)


async def test_sighup_reloads_a_real_bastion_serve(
    tmp_path: Path, tools_upstream: Upstream, http: httpx.AsyncClient
) -> None:
    """SIGHUP to ``bastion serve --config FILE``: a valid file is put in force, an invalid one is refused."""
    path = tmp_path / "bastion.toml"
    version_a = write_config(path, config(tmp_path, tools_upstream.url, "echo"))
    serve = ServeProcess(path, tmp_path / "data", tmp_path / "serve.log")
    try:
        url = await serve.ready()
        origin = url.removesuffix("/mcp")
        await wait_for_version(http, origin, version_a)
        session_id = await open_session(http, url, ALICE)
        before = answer_of(await call(http, url, ALICE, session_id, "tools__count"))
        assert reason_of(before) == "unknown_tool"

        # A valid file: in force after SIGHUP, on the same transport session.
        version_b = write_config(path, config(tmp_path, tools_upstream.url, "echo", "count"))
        serve.process.send_signal(signal.SIGHUP)
        ready = await wait_for_version(http, origin, version_b)
        assert ready["policy_reload_error"] is None
        after = answer_of(await call(http, url, ALICE, session_id, "tools__count"))
        assert "result" in after, after

        # An invalid file: refused; version B stays and readiness says why.
        path.write_text(toml_dumps(config(tmp_path, tools_upstream.url, "echo")) + "[[grants]\n")
        serve.process.send_signal(signal.SIGHUP)
        with anyio.fail_after(WAIT_S):
            while (await readyz(http, origin))[1]["policy_reload_error"] is None:
                await anyio.sleep(0.05)
        _, ready = await readyz(http, origin)
        assert ready["policy_version"] == version_b
        assert "TOML syntax error" in ready["policy_reload_error"]["message"]
        still = answer_of(await call(http, url, ALICE, session_id, "tools__count"))
        assert "result" in still, still
        assert serve.process.poll() is None  # a refused reload never stops the gateway
        admin = await http.post(f"{origin}/admin/reload", headers=bearer(ADMIN_TOKEN))
        assert admin.status_code == 422
    finally:
        serve.stop()
    assert "policy reload refused" in (tmp_path / "serve.log").read_text()
