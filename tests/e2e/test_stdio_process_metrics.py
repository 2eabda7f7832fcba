"""``GET /metrics`` counts what a stdio server's processes do (issue #25: per-process counts).

A real gateway with a real stdio server (``bastion.examples.notes_server``), one process per
client session and at most one: a first client's process is spawned, a second client is
refused at the bound, the first process is killed (SIGKILL) and comes back; a second server
whose process exits before its handshake fails every start. Read with the real Prometheus
parser.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from bastion.upstream.stdio import StdioUpstream
from tests.e2e.test_stdio_isolation import _config, _gateway, _notes_server
from tests.e2e.test_telemetry_e2e import scrape, value

pytestmark = pytest.mark.anyio


async def test_spawns_refusals_crashes_and_restarts_of_stdio_processes_are_counted(tmp_path: Path) -> None:
    """Running processes by scope, spawns, refusals at the bound, a crash, its restart and its
    reconnect, and failed starts each show in ``/metrics`` with the server's name, nothing more."""
    broken = {
        "command": sys.executable,
        "args": ["-c", "import sys; sys.exit(3)"],  # ends before its handshake, every time
        "timeout_s": 5.0,
    }
    config = _config({"notes": _notes_server(tmp_path, max_processes=1), "broken": broken})
    async with _gateway(tmp_path, config) as gateway, httpx.AsyncClient(timeout=30) as http:
        notes = gateway.gateway.fleet.upstreams["notes"]
        assert isinstance(notes, StdioUpstream)
        async with gateway.client("alice") as first:
            await first.call_tool("notes__echo", {"text": "one"})
            async with gateway.client("bob") as second:
                with pytest.raises(MCPError) as refused:
                    await second.session.call_tool("notes__echo", {"text": "two"})
            assert refused.value.error.data["reason"] == "upstream_capacity"
            before = await scrape(http, gateway.url)
            (process,) = notes.owned().values()
            assert process.pid is not None
            os.kill(process.pid, signal.SIGKILL)
            with anyio.fail_after(20):  # supervised: restarted for its owner, ready again
                while notes.counts.reconnects < 1:
                    await anyio.sleep(0.05)
            after = await scrape(http, gateway.url)
            assert await first.call_tool("notes__echo", {"text": "three"})

    assert value(before, "bastion_upstream_processes", server="notes", scope="listing") == 1
    assert value(before, "bastion_upstream_processes", server="notes", scope="transport_session") == 1
    assert value(before, "bastion_upstream_process_spawns_total", server="notes") == 2  # listing, alice's
    assert value(before, "bastion_upstream_process_crashes_total", server="notes") == 0
    assert value(before, "bastion_upstream_capacity_refusals_total", server="notes", bound="server") == 1
    assert value(before, "bastion_upstream_capacity_refusals_total", server="notes", bound="gateway") == 0

    assert value(after, "bastion_upstream_process_spawns_total", server="notes") == 3
    assert value(after, "bastion_upstream_process_crashes_total", server="notes") == 1
    assert value(after, "bastion_upstream_process_restarts_total", server="notes") == 1
    assert value(after, "bastion_upstream_reconnects_total", server="notes") == 1
    assert value(after, "bastion_upstream_process_spawn_failures_total", server="notes") == 0
    assert value(after, "bastion_upstream_processes", server="notes", scope="transport_session") == 1

    failures = value(after, "bastion_upstream_process_spawn_failures_total", server="broken")
    restarts = value(after, "bastion_upstream_process_restarts_total", server="broken")
    assert failures is not None and failures >= 1 and restarts is not None and restarts >= 1
    assert value(after, "bastion_upstream_process_crashes_total", server="broken") == 0
    assert value(after, "bastion_upstream_reconnects_total", server="broken") == 0
    # Only the server's name and its scope or bound: never an owner or a PID in a label.
    labels = {key for name, pairs in after if name.startswith("bastion_upstream_") for key, _ in pairs}
    assert labels <= {"server", "scope", "bound"}
