"""Active upstream health with a real HTTP upstream that dies and comes back (issue #11 points 1, 2, 3, 8).

The tools server is a real subprocess on a port this test picks, so it can be
killed and started again on the same address. No test here calls the dead
upstream to make the gateway notice: the gateway's own probes must.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from bastion.workers.attachment import sessionless_ref, transport_session_ref
from tests.e2e.issue4_support import (
    ADMIN_TOKEN,
    answer_of,
    base_config,
    bearer,
    call,
    file_gateway,
    mcp_headers,
    open_session,
    readyz,
    reason_of,
    rpc,
    static_token,
    write_config,
)
from tests.e2e.test_evidence_e2e import sessionless_call
from tests.e2e.test_telemetry_e2e import scrape, value

pytestmark = pytest.mark.anyio

HEAL_TIMEOUT_S = 30.0
_TOOLS_SERVER = (sys.executable, "-m", "bastion.examples.tools_server", "--host", "127.0.0.1")


class ToolsServer:
    """The example HTTP tools server on a fixed loopback port; killed and restarted at will."""

    def __init__(self, tmp_path: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._env = {**os.environ, "BASTION_COUNTER_FILE": str(tmp_path / "tools-counter.log")}
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*_TOOLS_SERVER, "--port", str(self.port)],
            stdout=subprocess.PIPE,
            text=True,
            env=self._env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("LISTENING "), line

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None


@pytest.fixture
def tools_server(tmp_path: Path) -> Iterator[ToolsServer]:
    server = ToolsServer(tmp_path)
    yield server
    server.kill()


def _config(tmp_path: Path, server: ToolsServer) -> Path:
    config = base_config(tmp_path, server.url)
    config["requirements"] = [{"agent": "alice", "namespaces": ["tools"]}]
    path = tmp_path / "gateway.toml"
    write_config(path, config)
    return path


async def _until_ready(http: httpx.AsyncClient, origin: str, want: bool) -> dict[str, object]:
    with anyio.fail_after(HEAL_TIMEOUT_S):
        while True:
            status, body = await readyz(http, origin)
            if (status == 200) is want:
                return body
            await anyio.sleep(0.1)


async def test_a_dead_required_upstream_is_noticed_without_a_call_and_reported_as_an_outage(
    tmp_path: Path, tools_server: ToolsServer
) -> None:
    """A killed required HTTP upstream turns /readyz 503 and refuses mutating calls, with no call to it."""
    tools_server.start()
    token = static_token("alice")
    async with (
        file_gateway(_config(tmp_path, tools_server), tmp_path / "data") as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        session = await open_session(http, gw.url, token)
        listed = await http.post(gw.url, headers=mcp_headers(token, session), json=rpc("tools/list"))
        assert any(t["name"].startswith("tools__") for t in answer_of(listed)["result"]["tools"])
        before = answer_of(await call(http, gw.url, token, session, "notes__increment"))
        assert "result" in before, before

        tools_server.kill()
        down = await _until_ready(http, gw.origin, want=False)

        refused = answer_of(await call(http, gw.url, token, session, "notes__increment"))
        read_only = answer_of(await call(http, gw.url, token, session, "notes__echo", {"text": "ok"}))
        sessionless = await sessionless_call(http, gw.url, "notes__increment")
    tools = next(u for u in down["upstreams"] if u["name"] == "tools")  # type: ignore[attr-defined]
    assert tools["connected"] is False
    assert reason_of(refused) == "required_namespace_not_connected", refused
    assert reason_of(sessionless) == "required_namespace_not_connected", sessionless
    assert reason_of(read_only) is None


async def test_an_upstream_down_at_start_heals_by_itself_and_calls_are_admitted_again(
    tmp_path: Path, tools_server: ToolsServer
) -> None:
    """An HTTP upstream absent at start is connected once it comes up: ready, calls admitted again."""
    token = static_token("alice")
    async with (
        file_gateway(_config(tmp_path, tools_server), tmp_path / "data") as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        status, _ = await readyz(http, gw.origin)
        session = await open_session(http, gw.url, token)
        refused = answer_of(await call(http, gw.url, token, session, "notes__increment"))
        refused_sessionless = await sessionless_call(http, gw.url, "notes__increment")

        tools_server.start()
        await _until_ready(http, gw.origin, want=True)

        admitted_sessionless = await sessionless_call(http, gw.url, "notes__increment")
        relisted = await http.post(gw.url, headers=mcp_headers(token, session), json=rpc("tools/list"))
        admitted = answer_of(await call(http, gw.url, token, session, "notes__increment"))
        upstream_call = await sessionless_call(http, gw.url, "tools__echo", {"text": "back"})
        # A sessionless agent's re-attach goes through the admin API like a session's (no 409).
        ref = sessionless_ref("alice", None)
        reattached = await http.post(
            f"{gw.origin}/admin/sessions/{ref}/reattach",
            headers=bearer(ADMIN_TOKEN),
            json={"namespace": "tools"},
        )
        attachments = await http.get(
            f"{gw.origin}/admin/sessions/{transport_session_ref(session)}/attachments",
            headers=bearer(ADMIN_TOKEN),
        )
    assert status == 503
    assert reason_of(refused) == "required_namespace_not_connected", refused
    assert reason_of(refused_sessionless) == "required_namespace_not_connected"
    assert any(t["name"].startswith("tools__") for t in answer_of(relisted)["result"]["tools"])
    assert "result" in admitted_sessionless, admitted_sessionless
    assert "result" in admitted, admitted
    assert "result" in upstream_call, upstream_call
    assert reattached.status_code == 200, reattached.text
    assert reattached.json()["evidence"]["condition"] is None
    assert attachments.json()["surface_listed_at"] is not None


async def test_a_restarted_upstream_is_reconnected_after_an_outage(
    tmp_path: Path, tools_server: ToolsServer
) -> None:
    """Down, then back on the same address: /readyz turns ready and the session's calls pass again."""
    tools_server.start()
    token = static_token("alice")
    async with (
        file_gateway(_config(tmp_path, tools_server), tmp_path / "data") as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        session = await open_session(http, gw.url, token)
        await http.post(gw.url, headers=mcp_headers(token, session), json=rpc("tools/list"))
        before = value(await scrape(http, gw.url), "bastion_upstream_reconnects_total", server="tools")
        tools_server.kill()
        await _until_ready(http, gw.origin, want=False)
        tools_server.start()
        await _until_ready(http, gw.origin, want=True)
        admitted = answer_of(await call(http, gw.url, token, session, "notes__increment"))
        echoed = answer_of(await call(http, gw.url, token, session, "tools__echo", {"text": "again"}))
        after = value(await scrape(http, gw.url), "bastion_upstream_reconnects_total", server="tools")
    assert "result" in admitted, admitted
    assert "result" in echoed, echoed
    # The first connection is no reconnect; the comeback is one (GET /metrics, issue #25).
    assert (before, after) == (0, 1)


async def test_sessionless_agents_do_not_share_one_pseudo_session(
    tmp_path: Path, tools_server: ToolsServer
) -> None:
    """Two agents' sessionless requests are tracked apart, each with the time its surface was listed."""
    tools_server.start()
    async with (
        file_gateway(_config(tmp_path, tools_server), tmp_path / "data") as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        config = base_config(tmp_path, tools_server.url)
        config["requirements"] = [{"agent": name, "namespaces": ["tools"]} for name in ("alice", "bob")]
        write_config(gw.config_path, config)
        assert (await http.post(f"{gw.origin}/admin/reload", headers=bearer(ADMIN_TOKEN))).status_code == 200
        await sessionless_call(http, gw.url, "notes__increment", agent="alice")
        await sessionless_call(http, gw.url, "notes__increment", agent="bob")
        tracked = gw.gateway.attachments.sessions()
        alice = gw.gateway.attachments.describe(sessionless_ref("alice", None))
    assert sessionless_ref("alice", None) in tracked and sessionless_ref("bob", None) in tracked
    assert "sessionless" not in tracked
    assert alice is not None and alice["surface_listed_at"] is not None
