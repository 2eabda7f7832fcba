"""Grants end to end (issue #4, DESIGN sections 2 step 4 and 8): every call decided by the snapshot in force.

A real gateway built from a TOML file with ``[[grants]]``, the real stdio
notes and HTTP tools upstreams, the official SDK client for lists and calls,
and raw HTTP where a call needs ``params._cmcp``. Once a grant is declared,
everything not granted is refused with a typed JSON-RPC error, and the
denial goes into the audit with the version of the snapshot that decided it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from bastion.call import RECEIPT_META_KEY
from tests.e2e.conftest import Upstream, counter_value
from tests.e2e.issue4_support import (
    FileGateway,
    answer_of,
    base_config,
    call,
    export_entries,
    file_gateway,
    open_session,
    readyz,
    reason_of,
    reload_policy,
    sdk_client,
    static_token,
    write_config,
)

pytestmark = pytest.mark.anyio

ALICE = static_token("alice")
BOB = static_token("bob")


def grants(*, alice_notes: tuple[str, ...] = ("add_note", "list_*")) -> list[dict[str, Any]]:
    return [
        {"name": "alice-tools", "agent": "alice", "servers": ["tools"], "tools": ["echo", "slow"]},
        {
            "name": "alice-notes",
            "agent": "alice",
            "namespaces": ["notes"],
            "tools": list(alice_notes),
            "arguments_schema": {
                "type": "object",
                "properties": {"text": {"type": "string", "maxLength": 12}},
                "additionalProperties": False,
            },
        },
        {
            "name": "alice-count",
            "agent": "alice",
            "servers": ["tools"],
            "tools": ["count"],
            "rate": "3/minute",
        },
        {
            "name": "alice-increment",
            "agent": "alice",
            "servers": ["tools"],
            "tools": ["increment"],
            "require_execution_id": True,
        },
        {
            "name": "alice-fail",
            "agent": "alice",
            "servers": ["tools"],
            "tools": ["fail"],
            "require_execution_id": True,
            "rate": "1/minute",
        },
        {"name": "bob-notes", "agent": "bob", "servers": ["notes"], "tools": ["echo"]},
    ]


def config(tmp_path: Path, tools_url: str, **kwargs: Any) -> dict[str, Any]:
    return {**base_config(tmp_path, tools_url), "grants": grants(**kwargs)}


@pytest.fixture
async def gw(tmp_path: Path, tools_upstream: Upstream) -> AsyncIterator[FileGateway]:
    path = tmp_path / "bastion.toml"
    write_config(path, config(tmp_path, tools_upstream.url))
    async with file_gateway(path, tmp_path / "data") as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def refused(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call through the SDK expecting a refusal; returns the JSON-RPC error's ``code`` and ``data``."""
    with pytest.raises(MCPError) as caught:
        await client.session.call_tool(name, arguments)
    error = caught.value.error
    data: dict[str, Any] = dict(error.data or {})
    return {"code": error.code, "message": error.message, **data}


async def test_tools_list_shows_each_agent_only_its_granted_tools(gw: FileGateway) -> None:
    """tools/list (official client) shows exactly what the agent's grants cover, per agent."""
    async with sdk_client(gw.url, ALICE) as client:
        alice = {tool.name for tool in (await client.list_tools()).tools}
    async with sdk_client(gw.url, BOB) as client:
        bob = {tool.name for tool in (await client.list_tools()).tools}
    assert alice == {
        "tools__echo",
        "tools__slow",
        "tools__count",
        "tools__increment",
        "tools__fail",
        "notes__add_note",
        "notes__list_notes",
    }
    assert bob == {"notes__echo"}


async def test_allowed_denied_by_tool_and_denied_by_argument_constraint(gw: FileGateway) -> None:
    """Granted: runs. Ungranted tool: ``unknown_tool``. Bad arguments: ``argument_constraint_failed``."""
    async with sdk_client(gw.url, ALICE) as client:
        allowed = await client.call_tool("tools__echo", {"text": "granted"})
        by_tool = await refused(client, "tools__hang", {})
        other_server = await refused(client, "notes__echo", {"text": "x"})
        secret = "a-secret-value-that-is-too-long"
        by_argument = await refused(client, "notes__add_note", {"text": secret})
        within = await client.call_tool("notes__add_note", {"text": "short note"})
    assert allowed.is_error is False and allowed.content[0].text == "granted"  # type: ignore[union-attr]
    assert within.is_error is False

    # Hidden by grants reads as unknown on the wire (issue #12); the audit keeps grant_denied.
    assert by_tool["code"] == -32602 and by_tool["reason"] == "unknown_tool"
    assert other_server["code"] == -32602 and other_server["reason"] == "unknown_tool"
    assert by_argument["code"] == -32032 and by_argument["reason"] == "argument_constraint_failed"
    assert by_argument["grant"] == "alice-notes"
    # The error names the grant and the place in the schema, never the argument's value.
    assert secret not in repr(by_argument)
    # Every denial carries the version of the snapshot that decided it.
    version = gw.gateway.snapshot().version
    assert by_argument["policy_version"] == version


async def test_rate_limit_per_agent_and_tool(gw: FileGateway) -> None:
    """``rate = "3/minute"``: three calls run, the fourth is ``rate_limited`` with a retry hint."""
    async with sdk_client(gw.url, ALICE) as client:
        for _ in range(3):
            result = await client.call_tool("tools__count", {})
            assert result.is_error is False
        limited = await refused(client, "tools__count", {})
    assert limited["code"] == -32033 and limited["reason"] == "rate_limited"
    assert limited["grant"] == "alice-count" and limited["retry_after_s"] > 0


async def test_require_execution_id(
    gw: FileGateway, http: httpx.AsyncClient, tools_upstream: Upstream
) -> None:
    """A grant with ``require_execution_id``: refused without one (nothing runs), allowed with one."""
    session_id = await open_session(http, gw.url, ALICE)
    before = counter_value(tools_upstream.counter_file)
    without = answer_of(await call(http, gw.url, ALICE, session_id, "tools__increment"))
    assert without["error"]["code"] == -32053 and reason_of(without) == "execution_id_required"
    assert counter_value(tools_upstream.counter_file) == before
    with_id = answer_of(
        await call(http, gw.url, ALICE, session_id, "tools__increment", execution_id="grants-increment-1")
    )
    assert "result" in with_id and with_id["result"]["isError"] is False
    assert counter_value(tools_upstream.counter_file) == before + 1


async def test_a_call_refused_for_its_missing_execution_id_spends_no_rate_token(
    gw: FileGateway, http: httpx.AsyncClient
) -> None:
    """With a rate and ``require_execution_id``, a call refused for its missing id spends no token."""
    session_id = await open_session(http, gw.url, ALICE)
    without = answer_of(await call(http, gw.url, ALICE, session_id, "tools__fail"))
    assert reason_of(without) == "execution_id_required"
    proper = answer_of(
        await call(http, gw.url, ALICE, session_id, "tools__fail", execution_id="grants-fail-1")
    )
    assert "result" in proper, proper


async def test_reload_changes_a_decision_between_two_calls_on_one_transport_session(
    gw: FileGateway, http: httpx.AsyncClient, tmp_path: Path, tools_upstream: Upstream
) -> None:
    """One SDK session: denied under snapshot A, allowed under B after a reload; each audited so."""
    _, ready = await readyz(http, gw.origin)
    version_a = ready["policy_version"]
    assert version_a == gw.gateway.snapshot().version

    async with sdk_client(gw.url, ALICE) as client:
        denied = await refused(client, "notes__echo", {"text": "before"})
        assert denied["reason"] == "unknown_tool"
        assert "notes__echo" not in {t.name for t in (await client.list_tools()).tools}

        version_b = write_config(
            gw.config_path, config(tmp_path, tools_upstream.url, alice_notes=("add_note", "list_*", "echo"))
        )
        reloaded = await reload_policy(http, gw.origin)
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json()["policy_version"] == version_b != version_a
        _, ready = await readyz(http, gw.origin)
        assert ready["policy_version"] == version_b and ready["policy_reload_error"] is None

        # The same transport session, the same tool and arguments: now allowed.
        allowed = await client.call_tool("notes__echo", {"text": "before"})
        assert allowed.is_error is False and allowed.content[0].text == "before"  # type: ignore[union-attr]
        assert "notes__echo" in {t.name for t in (await client.list_tools()).tools}
    evidence_session_id = denied["receipt"]["evidence_session_id"]
    assert allowed.meta is not None
    assert allowed.meta[RECEIPT_META_KEY]["evidence_session_id"] == evidence_session_id

    # The chain: the denial carries version A, the calls after the reload carry version B.
    entries = await export_entries(http, gw.origin, evidence_session_id, token=ALICE)
    denial = [e for e in entries if e["event"] == "refused" and e["tool"] == "echo"]
    assert len(denial) == 1
    assert denial[0]["reason"] == "grant_denied" and denial[0]["decision"] == "deny"
    assert denial[0]["policy_version"] == version_a
    after = [e for e in entries if e["event"] in ("admitted", "completed") and e["tool"] == "echo"]
    assert after and all(e["policy_version"] == version_b for e in after)
