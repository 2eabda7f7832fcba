"""Evidence sessions rotate at their entry bound, so every claim stays bounded and prompt."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.testing.loopback import serve_on_loopback
from tests.e2e.conftest import TOKENS, Upstream, gateway_config
from tests.e2e.test_transport_rules import open_session, rpc, session_headers

pytestmark = pytest.mark.anyio


async def test_a_long_transport_session_rotates_its_evidence_session(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Past the entry bound the chain closes with reason rotation, its claim issued; a new chain opens."""
    snapshot = snapshot_from_mapping(gateway_config(tmp_path, tools_upstream.url), source=None, version="t")
    options = RuntimeOptions(data_dir=tmp_path / "data", evidence_max_entries=6)
    app = create_app(snapshot, options)
    auth = {"authorization": f"Bearer {TOKENS['alice']}"}
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        session_id = await open_session(http, url)
        receipts = []
        for n in range(6):
            call = rpc("tools/call", {"name": "tools__echo", "arguments": {"text": str(n)}}, n + 1)
            answer = (await http.post(url, headers=session_headers(session_id), json=call)).json()
            receipts.append(answer["result"]["_meta"]["io.bastion/receipt"])
        evidence_ids = list(dict.fromkeys(r["evidence_session_id"] for r in receipts))
        assert len(evidence_ids) >= 2, receipts
        first = evidence_ids[0]
        claim = await http.get(url.replace("/mcp", f"/sessions/{first}/trace-claim"), headers=auth)
        bundle = await http.get(url.replace("/mcp", f"/audit/export?session_id={first}"), headers=auth)
        still_open = await http.get(
            url.replace("/mcp", f"/sessions/{evidence_ids[-1]}/trace-claim"), headers=auth
        )
    assert claim.status_code == 200
    assert still_open.status_code == 404  # the current chain has no claim until it closes
    entries = [json.loads(line) for line in bundle.text.splitlines()]
    assert entries[-1]["event"] == "session_close"
    assert entries[-1]["detail"] == {"close_reason": "rotation"}
    assert len(entries) <= 6 + 1  # the bound, plus its close entry
    assert [e["seq"] for e in entries] == list(range(len(entries)))
