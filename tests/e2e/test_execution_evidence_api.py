"""``GET /audit/execution``: every entry of one (agent, execution_id), for its agent or an auditor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from bastion.app import create_app
from bastion.cli.main import main
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream
from tests.e2e.issue4_support import AUDITOR_TOKEN, base_config
from tests.e2e.test_evidence_e2e import sessionless_call
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


async def test_execution_entries_are_found_for_their_agent_and_auditors_only(
    tmp_path: Path, tools_upstream: Upstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """Alice reads her own entries of an execution id, never Bob's; an auditor reads either, by agent."""
    snapshot = snapshot_from_mapping(base_config(tmp_path, tools_upstream.url), source=None, version="api")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        for agent in ("alice", "bob"):
            answer = await sessionless_call(
                http, url, "tools__echo", {"text": agent}, agent=agent, execution_id="shared"
            )
            assert "result" in answer, answer
        replay = await sessionless_call(http, url, "tools__echo", {"text": "alice"}, execution_id="shared")
        assert replay["error"]["data"]["reason"] == "execution_replay"
        endpoint = url.replace("/mcp", "/audit/execution")

        async def read(token: str, **params: str) -> tuple[int, list[dict[str, Any]]]:
            headers = {"authorization": f"Bearer {token}"}
            response = await http.get(endpoint, params={"execution_id": "shared", **params}, headers=headers)
            if response.status_code != 200:
                return response.status_code, []
            return 200, [json.loads(line) for line in response.text.splitlines()]

        own = await read(TOKENS["alice"])
        asked_for_bob = await read(TOKENS["alice"], agent="bob")
        audited_all = await read(AUDITOR_TOKEN)
        audited_bob = await read(AUDITOR_TOKEN, agent="bob")
        anonymous = await http.get(endpoint, params={"execution_id": "shared"})
    assert own[0] == 200 and {e["agent"] for e in own[1]} == {"alice"}
    assert [e["event"] for e in own[1]] == ["admitted", "invoking", "completed", "replay"]
    assert asked_for_bob[0] == 404
    assert {e["agent"] for e in audited_all[1]} == {"alice", "bob"} and len(audited_all[1]) == 7
    assert audited_bob[0] == 200 and [e["event"] for e in audited_bob[1]] == [
        "admitted",
        "invoking",
        "completed",
    ]
    assert anonymous.status_code == 401
    # `bastion audit find` over the same store keeps the two agents' executions apart.
    find = ["audit", "find", "--data-dir", str(tmp_path / "data"), "--execution-id", "shared"]
    assert await anyio.to_thread.run_sync(main, find) == 0
    listing = capsys.readouterr().out
    assert listing.startswith("7 entries carry execution_id 'shared' (2 agent(s))")
    alice, bob = listing.split("agent 'alice', execution_id 'shared': 4 entries")[1].split(
        "agent 'bob', execution_id 'shared': 3 entries"
    )
    assert "agent=bob" not in alice and "agent=alice" not in bob.split("evidence session")[0]
