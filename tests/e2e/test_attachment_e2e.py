"""Namespace attachment gates on a real gateway (DESIGN section 6): missing, contradictory, re-attach."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from bastion.workers.attachment import transport_session_ref
from tests.e2e.conftest import Upstream
from tests.e2e.issue4_support import (
    ADMIN_TOKEN,
    answer_of,
    base_config,
    bearer,
    call,
    file_gateway,
    mcp_headers,
    open_session,
    reason_of,
    reload_policy,
    rpc,
    static_token,
    write_config,
)

pytestmark = pytest.mark.anyio


async def test_connected_but_missing_from_the_surface_until_reattached(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A session whose surface lacks a required namespace: mutating calls refused; re-attach clears it."""
    config = base_config(tmp_path, tools_upstream.url)
    config["requirements"] = [{"agent": "alice", "namespaces": ["tools"]}]
    # Alice may use notes only, at first: her surface has no tools namespace.
    config["grants"] = [{"agent": "alice", "servers": ["notes"], "tools": ["*"]}]
    path = tmp_path / "gateway.toml"
    write_config(path, config)
    token = static_token("alice")
    async with file_gateway(path, tmp_path / "data") as gw, httpx.AsyncClient(timeout=30) as http:
        session = await open_session(http, gw.url, token)
        listed = await http.post(gw.url, headers=mcp_headers(token, session), json=rpc("tools/list"))
        assert all(t["name"].startswith("notes__") for t in answer_of(listed)["result"]["tools"])
        # The policy now grants tools too; the session's surface is stale until it re-attaches.
        config["grants"].append({"agent": "alice", "servers": ["tools"], "tools": ["*"]})
        write_config(path, config)
        assert (await reload_policy(http, gw.origin)).status_code == 200
        refused = answer_of(await call(http, gw.url, token, session, "notes__increment"))
        read_only = answer_of(await call(http, gw.url, token, session, "notes__echo", {"text": "ok"}))
        assert reason_of(refused) == "connected_namespace_missing"
        assert reason_of(read_only) is None
        ref = transport_session_ref(session)
        state = await http.get(f"{gw.origin}/admin/sessions/{ref}/attachments", headers=bearer(ADMIN_TOKEN))
        assert state.status_code == 200
        reattached = await http.post(
            f"{gw.origin}/admin/sessions/{ref}/reattach",
            headers=bearer(ADMIN_TOKEN),
            json={"namespace": "tools"},
        )
        assert reattached.status_code == 200, reattached.text
        allowed = answer_of(await call(http, gw.url, token, session, "notes__increment"))
    assert "result" in allowed, allowed


async def test_an_attached_upstream_that_died_refuses_mutating_calls_as_an_outage(
    tmp_path: Path, fresh_tools_upstream: Upstream
) -> None:
    """Attached in the session's surface but the upstream is gone: an outage (not connected), refused."""
    config = base_config(tmp_path, fresh_tools_upstream.url)
    config["requirements"] = [{"agent": "alice", "namespaces": ["tools"]}]
    path = tmp_path / "gateway.toml"
    write_config(path, config)
    token = static_token("alice")
    async with file_gateway(path, tmp_path / "data") as gw, httpx.AsyncClient(timeout=30) as http:
        session = await open_session(http, gw.url, token)
        await http.post(gw.url, headers=mcp_headers(token, session), json=rpc("tools/list"))
        fresh_tools_upstream.process.kill()
        fresh_tools_upstream.process.wait(timeout=10)
        # A call that finds the upstream gone makes its health say "not connected".
        with anyio.fail_after(20):
            while gw.gateway.fleet.upstreams["tools"].health().connected:
                await call(http, gw.url, token, session, "tools__echo", {"text": "x"})
        refused = answer_of(await call(http, gw.url, token, session, "notes__increment"))
        read_only = answer_of(await call(http, gw.url, token, session, "notes__echo", {"text": "ok"}))
    assert reason_of(refused) == "required_namespace_not_connected", refused
    assert reason_of(read_only) is None
