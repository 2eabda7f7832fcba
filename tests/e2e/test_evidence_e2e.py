"""Evidence a real gateway issues (DESIGN section 4): claims verify offline, pass TRACE, resist tampering.

One module-scoped gateway run produces two closed evidence sessions as files:
the one sessionless requests share (closed at its age bound) and a session-era
client's (closed by DELETE), each with a call that carries an execution id.
The helpers at the top (a raw sessionless ``tools/call``, receipts, claim and
bundle fetches) are shared by the other execution tests of this directory.
"""

from __future__ import annotations

import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from agentrust_trace import validate_json, verify_record
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_tests.modules.unverified import finding_counts_as_level_failure
from trace_tests.runner import run as run_conformance

from bastion.app import create_app
from bastion.call import RECEIPT_META_KEY
from bastion.cli.verify_cmd import EXIT_FAILED, EXIT_OK, run_verify
from bastion.crypto.keys import VerifyingKey
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import SESSIONLESS_MAX_AGE_S, TOKENS, RunningGateway, Upstream, gateway_config
from tests.e2e.test_transport_rules import (
    MODERN_META,
    modern_headers,
    open_session,
    rpc,
    session_headers,
)
from tests.support.loopback import serve_on_loopback

BIN = Path(sys.executable).parent
CLAIM_WAIT_S = 5.0


# ---------------------------------------------------------------- helpers shared by the execution tests


def auth(agent: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[agent]}"}


def call_params(
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    execution_id: str | None = None,
    workflow_id: str | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``tools/call`` params with ``_cmcp`` holding only the ids given."""
    params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
    if meta is not None:
        params["_meta"] = meta
    cmcp = {k: v for k, v in (("execution_id", execution_id), ("workflow_id", workflow_id)) if v is not None}
    if cmcp:
        params["_cmcp"] = cmcp
    return params


async def sessionless_call(
    http: httpx.AsyncClient,
    url: str,
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    agent: str = "alice",
    execution_id: str | None = None,
    workflow_id: str | None = None,
) -> dict[str, Any]:
    """One raw 2026-07-28 ``tools/call``; returns the JSON-RPC answer (result or error)."""
    params = call_params(
        name, arguments, execution_id=execution_id, workflow_id=workflow_id, meta=MODERN_META
    )
    response = await http.post(
        url, headers={**modern_headers("tools/call", name), **auth(agent)}, json=rpc("tools/call", params)
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def receipt_of(answer: dict[str, Any]) -> dict[str, Any]:
    """The gateway's receipt, from a result's ``_meta`` or an error's ``data``."""
    if "result" in answer:
        receipt: dict[str, Any] = answer["result"]["_meta"][RECEIPT_META_KEY]
    else:
        receipt = answer["error"]["data"]["receipt"]
    return receipt


def reason_of(answer: dict[str, Any]) -> str | None:
    """The refusal reason, or ``None`` for a result."""
    return answer["error"]["data"]["reason"] if "error" in answer else None


def origin(url: str) -> str:
    return url.removesuffix("/mcp")


async def wait_for_claim(
    http: httpx.AsyncClient, url: str, session_id: str, *, agent: str = "alice"
) -> bytes:
    """The claim file's bytes, polled (bounded): an abandoned request closes its chain after it."""
    with anyio.fail_after(CLAIM_WAIT_S):
        while True:
            response = await http.get(f"{origin(url)}/sessions/{session_id}/trace-claim", headers=auth(agent))
            if response.status_code == 200:
                return response.content
            assert response.json()["error"]["reason"] == "claim_not_issued", response.text
            await anyio.sleep(0.02)


async def export_bundle(http: httpx.AsyncClient, url: str, session_id: str, *, agent: str = "alice") -> bytes:
    response = await http.get(
        f"{origin(url)}/audit/export", params={"session_id": session_id}, headers=auth(agent)
    )
    assert response.status_code == 200, response.text
    return response.content


def bundle_entries(bundle: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in bundle.splitlines()]


async def save_evidence(
    http: httpx.AsyncClient, url: str, session_id: str, directory: Path, *, agent: str = "alice"
) -> tuple[Path, Path]:
    """Write a closed evidence session's bundle and claim to files; returns their paths."""
    claim = await wait_for_claim(http, url, session_id, agent=agent)
    bundle = await export_bundle(http, url, session_id, agent=agent)
    bundle_path, claim_path = directory / f"{session_id}.jsonl", directory / f"{session_id}.claim.json"
    bundle_path.write_bytes(bundle)
    claim_path.write_bytes(claim)
    return bundle_path, claim_path


def write_public_key(data_dir: Path, path: Path) -> Path:
    """``bastion public-key --data-dir DIR`` (the real CLI), saved to ``path``."""
    result = subprocess.run(
        [str(BIN / "bastion"), "public-key", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("-----BEGIN PUBLIC KEY-----")
    path.write_text(result.stdout)
    return path


def verify_quietly(bundle: Path, claim: Path | None, key: Path) -> tuple[int, str]:
    """``bastion verify`` in-process (its exit code and output), for loops that run it often."""
    out, err = io.StringIO(), io.StringIO()
    code = run_verify(bundle, claim, key, jobs=1, out=out, err=err)
    return code, out.getvalue() + err.getvalue()


# ---------------------------------------------------------------- one gateway run, two evidence sessions


@dataclass(frozen=True)
class EvidenceFiles:
    kind: str
    execution_id: str
    session_id: str
    bundle: Path
    claim: Path
    key: Path

    @property
    def claim_object(self) -> dict[str, Any]:
        claim: dict[str, Any] = orjson.loads(self.claim.read_bytes())
        return claim


async def _produce(directory: Path, tools_url: str) -> dict[str, EvidenceFiles]:
    snapshot = snapshot_from_mapping(gateway_config(directory, tools_url), source=None, version="evidence")
    data_dir = directory / "data"
    options = RuntimeOptions(data_dir=data_dir, sessionless_evidence_max_age_s=SESSIONLESS_MAX_AGE_S)
    app = create_app(snapshot, options)
    found: dict[str, tuple[str, str]] = {}
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        with anyio.fail_after(30):
            sessionless_id = "evidence-sessionless-9f3b1c"
            answer = await sessionless_call(
                http, url, "tools__echo", {"text": "hi"}, execution_id=sessionless_id, workflow_id="wf-e"
            )
            found["sessionless"] = (sessionless_id, receipt_of(answer)["evidence_session_id"])

            session_era_id = "evidence-session-era-4d2a7e"
            transport_session = await open_session(http, url)
            response = await http.post(
                url,
                headers=session_headers(transport_session),
                json=rpc(
                    "tools/call",
                    call_params("tools__echo", {"text": "hi"}, execution_id=session_era_id),
                ),
            )
            found["session"] = (session_era_id, receipt_of(response.json())["evidence_session_id"])
            deleted = await http.delete(url, headers=session_headers(transport_session))
            assert deleted.status_code == 200
            saved = {
                kind: await save_evidence(http, url, session_id, directory)
                for kind, (_, session_id) in found.items()
            }
    key = write_public_key(data_dir, directory / "gateway.pem")
    return {
        kind: EvidenceFiles(kind, execution_id, session_id, *saved[kind], key)
        for kind, (execution_id, session_id) in found.items()
    }


@pytest.fixture(scope="module")
def gateway_evidence(
    tmp_path_factory: pytest.TempPathFactory, tools_upstream: Upstream
) -> dict[str, EvidenceFiles]:
    return anyio.run(_produce, tmp_path_factory.mktemp("evidence"), tools_upstream.url)


@pytest.fixture(params=["sessionless", "session"])
def evidence(request: pytest.FixtureRequest, gateway_evidence: dict[str, EvidenceFiles]) -> EvidenceFiles:
    return gateway_evidence[request.param]


# ---------------------------------------------------------------- offline verification and TRACE


def test_claim_verifies_offline_with_the_cli(evidence: EvidenceFiles) -> None:
    """`bastion verify BUNDLE --claim CLAIM --key PEM` (the installed CLI) accepts a gateway session."""
    result = subprocess.run(
        [
            str(BIN / "bastion"),
            "verify",
            str(evidence.bundle),
            "--claim",
            str(evidence.claim),
            "--key",
            str(evidence.key),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    assert f"evidence session {evidence.session_id}" in result.stdout
    assert "signature and every stated fact verified" in result.stdout


def test_bundle_records_the_call_and_how_the_session_closed(evidence: EvidenceFiles) -> None:
    """The chain runs genesis → attestation → admitted → invoking → completed → close, ids as given."""
    entries = bundle_entries(evidence.bundle.read_bytes())
    assert [e["event"] for e in entries] == [
        "session_open",
        "session_open",
        "admitted",
        "invoking",
        "completed",
        "session_close",
    ]
    calls = entries[2:5]
    assert {e["execution_id"] for e in calls} == {evidence.execution_id}
    assert len({e["call_id"] for e in calls}) == 1
    assert {e["session_id"] for e in entries} == {evidence.session_id}
    expected_close = "rotation" if evidence.kind == "sessionless" else "client_delete"
    assert entries[-1]["detail"] == {"close_reason": expected_close}


def test_claim_passes_the_trace_conformance_suite(evidence: EvidenceFiles) -> None:
    """The claim passes `trace-tests verify --level 0` and `agentrust_trace.verify_record`."""
    result = subprocess.run(
        [str(BIN / "trace-tests"), "verify", "--record", str(evidence.claim), "--level", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Result: PASS" in result.stdout
    claim = evidence.claim_object
    findings = run_conformance(claim, "trace", 0)
    failing = [f for module in findings.values() for f in module if finding_counts_as_level_failure(f, 0)]
    assert failing == []
    key = VerifyingKey.load(evidence.key.read_bytes())
    verified = verify_record(claim, key.to_jwk())
    assert verified.trusted_key_thumbprint == key.key_id
    validate_json(claim)


def test_claim_never_contains_the_execution_id(evidence: EvidenceFiles) -> None:
    """The bundle carries the execution id (records join on it); the claim never does."""
    assert evidence.execution_id.encode() in evidence.bundle.read_bytes()
    claim = evidence.claim.read_bytes()
    assert evidence.execution_id.encode() not in claim
    assert b"execution" not in claim


# ---------------------------------------------------------------- every single-byte change is detected


def _flip(original: bytes, position: int, delta: int) -> bytes:
    index = position % len(original)
    changed = bytearray(original)
    changed[index] = (changed[index] + delta) % 256
    return bytes(changed)


@pytest.mark.parametrize("target", ["bundle", "claim"])
def test_any_single_byte_change_is_detected(
    gateway_evidence: dict[str, EvidenceFiles], tmp_path_factory: pytest.TempPathFactory, target: str
) -> None:
    """Changing any one byte of an exported bundle or of its claim makes `bastion verify` exit 1."""
    scratch = tmp_path_factory.mktemp(f"tampered-{target}")
    for evidence in gateway_evidence.values():
        assert verify_quietly(evidence.bundle, evidence.claim, evidence.key)[0] == EXIT_OK

    @settings(max_examples=60, deadline=None, database=None)
    @given(
        kind=st.sampled_from(sorted(gateway_evidence)),
        position=st.integers(min_value=0, max_value=1 << 20),
        delta=st.integers(min_value=1, max_value=255),
    )
    def check(kind: str, position: int, delta: int) -> None:
        evidence = gateway_evidence[kind]
        bundle, claim = evidence.bundle, evidence.claim
        if target == "bundle":
            bundle = scratch / "bundle.jsonl"
            bundle.write_bytes(_flip(evidence.bundle.read_bytes(), position, delta))
        else:
            claim = scratch / "claim.json"
            claim.write_bytes(_flip(evidence.claim.read_bytes(), position, delta))
        code, output = verify_quietly(bundle, claim, evidence.key)
        assert code == EXIT_FAILED, output

    check()


# ---------------------------------------------------------------- read paths belong to the owner


@pytest.mark.anyio
async def test_other_agents_get_404_for_both_read_paths(running_gateway: RunningGateway) -> None:
    """Bob reads neither Alice's claim nor her export: the same 404 as for a session that does not exist."""
    url = running_gateway.url
    async with running_gateway.raw() as http:
        answer = await sessionless_call(http, url, "tools__echo", {"text": "mine"}, execution_id="owner-1")
        session_id = receipt_of(answer)["evidence_session_id"]
        await wait_for_claim(http, url, session_id)
        assert b'"owner-1"' in await export_bundle(http, url, session_id)
        foreign_claim = await http.get(
            f"{origin(url)}/sessions/{session_id}/trace-claim", headers=auth("bob")
        )
        foreign_export = await http.get(
            f"{origin(url)}/audit/export", params={"session_id": session_id}, headers=auth("bob")
        )
        unknown_id = "ev_" + "0" * 32
        unknown_claim = await http.get(
            f"{origin(url)}/sessions/{unknown_id}/trace-claim", headers=auth("bob")
        )
        unknown_export = await http.get(
            f"{origin(url)}/audit/export", params={"session_id": unknown_id}, headers=auth("bob")
        )
        anonymous = await http.get(f"{origin(url)}/sessions/{session_id}/trace-claim")
    for response in (foreign_claim, foreign_export, unknown_claim, unknown_export):
        assert response.status_code == 404
        assert response.json()["error"]["reason"] == "session_not_found"
        assert b"owner-1" not in response.content
    assert foreign_claim.json() == unknown_claim.json()
    assert foreign_export.json() == unknown_export.json()
    assert anonymous.status_code == 401


@pytest.mark.anyio
async def test_sessionless_receipts_name_durable_entries_and_the_claim_follows(
    running_gateway: RunningGateway,
) -> None:
    """Each sessionless receipt names an entry already in its chain; the claim follows within the bound."""
    url = running_gateway.url
    async with running_gateway.raw() as http:
        answer = await sessionless_call(http, url, "tools__echo", {"text": "prompt"})
        receipt = receipt_of(answer)
        session_id = receipt["evidence_session_id"]
        # Durable before the answer: the receipt's entry is in the chain now, seq and hash alike.
        entries = bundle_entries(await export_bundle(http, url, session_id))
        assert entries[receipt["seq"]]["hash"] == receipt["entry_hash"]
        assert entries[receipt["seq"]]["call_id"] == receipt["call_id"]
        claim = orjson.loads(await wait_for_claim(http, url, session_id))
    head = next(ref for ref in claim["references"] if ref["rel"] == "bastion:audit-chain-head")
    assert int(head["id"].rsplit("#", 1)[1]) > receipt["seq"]  # the close entry follows the call


@pytest.mark.anyio
async def test_the_claim_of_an_open_shared_chain_is_not_issued_yet(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Before its chain closes, the claim is a typed 404 ``claim_not_issued`` with a Retry-After."""
    snapshot = snapshot_from_mapping(gateway_config(tmp_path, tools_upstream.url), source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))  # the default 60 s bound
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        answer = await sessionless_call(http, url, "tools__echo", {"text": "early"})
        session_id = receipt_of(answer)["evidence_session_id"]
        response = await http.get(f"{origin(url)}/sessions/{session_id}/trace-claim", headers=auth("alice"))
    assert response.status_code == 404
    assert response.json()["error"]["reason"] == "claim_not_issued"
    assert response.headers["retry-after"].isdigit()
