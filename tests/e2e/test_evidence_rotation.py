"""Evidence sessions rotate at their entry bound, so every claim stays bounded and prompt."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bastion.app import create_app
from bastion.crypto.jcs import canonical_json
from bastion.crypto.key_set import verify_key_set
from bastion.gateway import RuntimeOptions
from bastion.policy.digest import snapshot_digest, snapshot_document
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream, gateway_config
from tests.e2e.test_transport_rules import open_session, rpc, session_headers
from tests.support.loopback import serve_on_loopback

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


async def test_the_entry_bound_is_exact_and_a_call_never_spans_two_chains(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Bound 6: every chain (genesis and close included) has at most 6 entries; a call stays in one."""
    snapshot = snapshot_from_mapping(gateway_config(tmp_path, tools_upstream.url), source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data", evidence_max_entries=6))
    auth = {"authorization": f"Bearer {TOKENS['alice']}"}
    receipts: list[dict[str, Any]] = []
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        session_id = await open_session(http, url)

        async def call(n: int, execution: bool) -> None:
            params: dict[str, Any] = {"name": "tools__echo", "arguments": {"text": str(n)}}
            if execution:
                params["_cmcp"] = {"execution_id": f"bound-{n}"}
            answer = (
                await http.post(url, headers=session_headers(session_id), json=rpc("tools/call", params, n))
            ).json()
            receipts.append(answer["result"]["_meta"]["io.bastion/receipt"])

        for n in range(5):  # 3 entries with an execution id, 2 without: the old bound gave 8-entry chains
            await call(n, execution=n % 2 == 0)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for n in range(5, 11):
                    tg.start_soon(call, n, True)
        assert (await http.delete(url, headers=session_headers(session_id))).status_code in (200, 202, 204)
        evidence_ids = list(dict.fromkeys(r["evidence_session_id"] for r in receipts))
        bundles = {}
        for evidence_id in evidence_ids:
            with anyio.fail_after(30):
                while (
                    await http.get(url.replace("/mcp", f"/sessions/{evidence_id}/trace-claim"), headers=auth)
                ).status_code != 200:
                    await anyio.sleep(0.05)
            export = await http.get(
                url.replace("/mcp", f"/audit/export?session_id={evidence_id}"), headers=auth
            )
            bundles[evidence_id] = [json.loads(line) for line in export.text.splitlines()]
    assert len(receipts) == 11 and len(evidence_ids) >= 4
    sessions_of_call: dict[str, set[str]] = {}
    for evidence_id, entries in bundles.items():
        assert len(entries) <= 6, [e["event"] for e in entries]
        assert entries[-1]["event"] == "session_close"
        for entry in entries:
            if entry["call_id"] is not None:
                sessions_of_call.setdefault(entry["call_id"], set()).add(evidence_id)
    assert {r["call_id"] for r in receipts} <= set(sessions_of_call)
    assert all(len(sessions) == 1 for sessions in sessions_of_call.values()), sessions_of_call


async def test_the_claim_commits_to_the_compiled_policy_snapshot(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """policy.bundle_hash is the SHA-256 of the snapshot's RFC 8785 form, not a hash of the 16-hex version."""
    snapshot = snapshot_from_mapping(
        gateway_config(tmp_path, tools_upstream.url), source=None, version="0123456789abcdef"
    )
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    auth = {"authorization": f"Bearer {TOKENS['alice']}"}
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        session_id = await open_session(http, url)
        call = rpc("tools/call", {"name": "tools__echo", "arguments": {"text": "x"}}, 1)
        answer = (await http.post(url, headers=session_headers(session_id), json=call)).json()
        evidence_id = answer["result"]["_meta"]["io.bastion/receipt"]["evidence_session_id"]
        await http.delete(url, headers=session_headers(session_id))
        with anyio.fail_after(30):
            while (
                claim := await http.get(
                    url.replace("/mcp", f"/sessions/{evidence_id}/trace-claim"), headers=auth
                )
            ).status_code != 200:
                await anyio.sleep(0.05)
    policy = claim.json()["policy"]
    expected = "sha256:" + hashlib.sha256(canonical_json(snapshot_document(snapshot))).hexdigest()
    assert policy["bundle_hash"] == expected == snapshot_digest(snapshot)
    assert policy["bundle_hash"] != "sha256:" + hashlib.sha256(b"0123456789abcdef").hexdigest()
    assert policy["version"] == "0123456789abcdef"
    # The document is the compiled policy: a grant-free snapshot with these servers and agents.
    document = snapshot_document(snapshot)
    assert set(document["servers"]) == {"notes", "tools"} and "version" not in document


async def test_the_gateway_publishes_the_keys_its_claims_name(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """/.well-known/bastion-keys.json lists the active key, signed by it; a claim names that key id."""
    snapshot = snapshot_from_mapping(gateway_config(tmp_path, tools_upstream.url), source=None, version="k")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    auth = {"authorization": f"Bearer {TOKENS['alice']}"}
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        published = await http.get(url.replace("/mcp", "/.well-known/bastion-keys.json"))
        session_id = await open_session(http, url)
        call = rpc("tools/call", {"name": "tools__echo", "arguments": {"text": "x"}}, 1)
        answer = (await http.post(url, headers=session_headers(session_id), json=call)).json()
        evidence_id = answer["result"]["_meta"]["io.bastion/receipt"]["evidence_session_id"]
        await http.delete(url, headers=session_headers(session_id))
        claim_url = url.replace("/mcp", f"/sessions/{evidence_id}/trace-claim")
        with anyio.fail_after(30):
            while (claim := await http.get(claim_url, headers=auth)).status_code != 200:
                await anyio.sleep(0.05)
        pinned = app.state.gateway.keyring.active
    assert published.status_code == 200  # no credential needed: verifiers pin these keys
    document = published.json()
    assert [key.key_id for key in verify_key_set(document, pinned)] == [pinned.key_id]
    assert claim.json()["cnf"]["jwk"]["kid"] == document["active"] == pinned.key_id
