"""Terminal persistence failure (seed 000; DESIGN sections 3 and 9; issue #3 point 8).

A gateway whose store fails the terminal write (``FaultyStore`` at
``record_outcome``, before or after the commit) in front of the real HTTP
tools upstream: the client is told (``not_durable``), the execution never
becomes re-runnable, new admissions are refused while the store is degraded,
and once storage returns (the health probe runs every second) the gateway
admits again and the audit holds the entry it owed, in a chain that verifies.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from bastion.admission.states import ExecutionState
from bastion.app import create_app
from bastion.cli.verify_cmd import EXIT_OK
from bastion.gateway import Gateway, RuntimeOptions
from bastion.ids import AgentId, ExecutionId
from bastion.policy.load import snapshot_from_mapping
from bastion.store.base import Store
from tests.e2e.conftest import SESSIONLESS_MAX_AGE_S, Upstream, counter_value, gateway_config
from tests.e2e.issue4_support import ADMIN_TOKEN, auth_table, bearer
from tests.e2e.test_evidence_e2e import (
    bundle_entries,
    call_params,
    export_bundle,
    origin,
    reason_of,
    receipt_of,
    save_evidence,
    sessionless_call,
    verify_quietly,
    wait_for_claim,
    write_public_key,
)
from tests.e2e.test_execution_restart import entries_with
from tests.e2e.test_transport_rules import open_session, rpc, session_headers
from tests.support.faulty_store import FailWhen, FaultyStore
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

RECOVERY_WAIT_S = 6.0  # the probe runs every second


@dataclass
class FaultyGateway:
    url: str
    gateway: Gateway
    faulty: FaultyStore
    data_dir: Path

    async def state(self, execution_id: str) -> ExecutionState | None:
        assert self.gateway.store is not None
        record = await self.gateway.store.get_execution(AgentId("alice"), ExecutionId(execution_id))
        return None if record is None else record.state


@contextlib.asynccontextmanager
async def faulty_gateway(tmp_path: Path, tools_url: str, when: FailWhen) -> AsyncIterator[FaultyGateway]:
    """A gateway whose terminal writes fail (``when``) until ``faulty.recover()``."""
    made: list[FaultyStore] = []

    def wrap(inner: Store) -> Store:
        made.append(FaultyStore(inner, fail_at="record_outcome", when=when, times=None))
        return made[-1]

    config = {**gateway_config(tmp_path, tools_url), "auth": auth_table()}  # /readyz detail needs the admin
    snapshot = snapshot_from_mapping(config, source=None, version="durability")
    data_dir = tmp_path / "data"
    options = RuntimeOptions(
        data_dir=data_dir, store_factory=wrap, sessionless_evidence_max_age_s=SESSIONLESS_MAX_AGE_S
    )
    app = create_app(snapshot, options)
    async with serve_on_loopback(app) as url:
        yield FaultyGateway(url, app.state.gateway, made[0], data_dir)


async def readiness(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    detail: dict[str, Any] = (await http.get(f"{origin(url)}/readyz", headers=bearer(ADMIN_TOKEN))).json()
    return detail


async def wait_until_recovered(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    with anyio.fail_after(RECOVERY_WAIT_S):
        while (detail := await readiness(http, url))["store"]["degraded"]:
            await anyio.sleep(0.05)
    return detail


async def session_call(
    http: httpx.AsyncClient, url: str, transport_session: str, name: str, **ids: str
) -> dict[str, Any]:
    arguments = {"text": "x"} if name == "tools__echo" else {}
    response = await http.post(
        url,
        headers=session_headers(transport_session),
        json=rpc("tools/call", call_params(name, arguments, **ids)),
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.mark.parametrize("when", ["before_commit", "after_commit"])
async def test_failed_terminal_write_never_allows_a_second_invocation(
    tmp_path: Path, tools_upstream: Upstream, when: FailWhen
) -> None:
    """The client is told, the id is never re-run, admissions wait for storage, the audit catches up."""
    counter = tools_upstream.counter_file
    execution_id = f"durability-{when}"
    async with (
        faulty_gateway(tmp_path, tools_upstream.url, when) as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        transport_session = await open_session(http, gw.url)
        before = counter_value(counter)

        # 1. The upstream ran; the terminal write failed: the client gets a clear, typed error.
        failed = await session_call(
            http, gw.url, transport_session, "tools__increment", execution_id=execution_id
        )
        assert reason_of(failed) == "not_durable", failed
        assert failed["error"]["data"]["observed_outcome"] == "completed"
        assert failed["error"]["data"]["execution_id"] == execution_id
        evidence_session = receipt_of(failed)["evidence_session_id"]
        assert evidence_session is not None
        assert counter_value(counter) == before + 1
        # Before the commit the row stays invoking; after it, the write landed but nobody was told so.
        assert await gw.state(execution_id) is (
            ExecutionState.INVOKING if when == "before_commit" else ExecutionState.COMPLETED
        )
        detail = await readiness(http, gw.url)
        assert detail["ready"] is False
        assert detail["store"]["degraded"] is True
        assert detail["store"]["audit_owed"] == 1

        # 2. While degraded: the retry and every new admission are refused, whatever the era.
        retry = await session_call(
            http, gw.url, transport_session, "tools__increment", execution_id=execution_id
        )
        fresh = await session_call(
            http, gw.url, transport_session, "tools__echo", execution_id=f"{execution_id}-new"
        )
        no_id = await session_call(http, gw.url, transport_session, "tools__echo")
        sessionless = await sessionless_call(http, gw.url, "tools__increment", execution_id=execution_id)
        assert [reason_of(a) for a in (retry, fresh, no_id, sessionless)] == ["not_durable"] * 4
        assert counter_value(counter) == before + 1

        # 3. Storage returns: the probe clears the degraded state and writes what the audit is owed.
        gw.faulty.recover()
        detail = await wait_until_recovered(http, gw.url)
        assert detail["store"]["audit_owed"] == 0

        # 4. The execution is still refused, now as a replay: the outcome this replica observed was
        # made durable once storage returned (issue #23), or had landed after all.
        again = await session_call(
            http, gw.url, transport_session, "tools__increment", execution_id=execution_id
        )
        assert reason_of(again) == "execution_replay", again
        assert again["error"]["data"]["earlier_outcome"] == "completed"
        assert await gw.state(execution_id) is ExecutionState.COMPLETED
        assert counter_value(counter) == before + 1
        admitted = await session_call(
            http, gw.url, transport_session, "tools__echo", execution_id=f"{execution_id}-after"
        )
        assert "result" in admitted, admitted

        # 5. The chain says what happened: the owed entry follows the call's invoking entry.
        entries = [
            e
            for e in bundle_entries(await export_bundle(http, gw.url, evidence_session))
            if e["execution_id"] == execution_id
        ]
        events = [(e["event"], e["reason"], e["outcome"]) for e in entries]
        # The terminal row and its entry are one write: after the commit both landed (and the
        # owed refusal says the client was told otherwise); before it, neither did, and both
        # are written late, once storage returned: the refusal, then the observed outcome.
        landed = [("completed", None, "completed")] if when == "after_commit" else []
        written_late = [("completed", None, "completed")] if when == "before_commit" else []
        assert events[:4] == [
            ("admitted", None, None),
            ("invoking", None, None),
            *landed,
            ("refused", "terminal_write_failed", "completed"),
            *written_late,
        ]
        assert len({e["call_id"] for e in entries[:4]}) == 1
        owed = entries[2 + len(landed)]
        assert (owed["server"], owed["tool"], owed["binding"]) == (
            "tools",
            "increment",
            entries[0]["binding"],
        )
        assert owed["detail"]["late"] is True
        if when == "before_commit":
            assert entries[3]["detail"]["late"] is True and entries[3]["epoch"] == entries[1]["epoch"]

        # 6. Once the client session ends, that chain verifies offline with its claim.
        deleted = await http.delete(gw.url, headers=session_headers(transport_session))
        assert deleted.status_code == 200
        bundle, claim = await save_evidence(http, gw.url, evidence_session, tmp_path)
        code, output = verify_quietly(bundle, claim, write_public_key(gw.data_dir, tmp_path / "gateway.pem"))
        assert code == EXIT_OK, output


async def test_sessionless_failed_terminal_write_recovers(tmp_path: Path, tools_upstream: Upstream) -> None:
    """Sessionless: the owed entry reaches the agent's shared chain (or the next one) once storage returns.

    Regression: the owed write once targeted a closed chain, raised
    RuntimeError out of the health watcher and left the store degraded for good.
    """
    counter = tools_upstream.counter_file
    execution_id = "durability-sessionless"
    async with (
        faulty_gateway(tmp_path, tools_upstream.url, "before_commit") as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        before = counter_value(counter)
        failed = await sessionless_call(http, gw.url, "tools__increment", execution_id=execution_id)
        assert reason_of(failed) == "not_durable", failed
        assert counter_value(counter) == before + 1

        gw.faulty.recover()
        await wait_until_recovered(http, gw.url)
        admitted = await sessionless_call(http, gw.url, "tools__echo", {"text": "x"}, execution_id="after")
        assert "result" in admitted, admitted
        owed = [e for e in entries_with(gw.data_dir, execution_id) if e["reason"] == "terminal_write_failed"]
        assert [(e["event"], e["outcome"], e["call_id"]) for e in owed] == [
            ("refused", "completed", receipt_of(failed)["call_id"])
        ]
        assert owed[0]["detail"]["late"] is True
        refused = await sessionless_call(http, gw.url, "tools__increment", execution_id=execution_id)
        assert reason_of(refused) == "execution_replay"  # the observed outcome was made durable (#23)
        assert counter_value(counter) == before + 1

        # The chain that holds the late entry is closed, with a claim that verifies offline.
        bundle, claim = await save_evidence(http, gw.url, owed[0]["session_id"], tmp_path)
        code, output = verify_quietly(bundle, claim, write_public_key(gw.data_dir, tmp_path / "gateway.pem"))
        assert code == EXIT_OK, output


async def test_a_lost_admission_acknowledgement_is_settled_as_recovery_would(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """The admission landed but was reported failed: nothing was sent; once storage is back, the
    live replica makes the row ``outcome_unknown`` (as recovery would) and the retry is a replay."""
    counter = tools_upstream.counter_file
    made: list[FaultyStore] = []

    def wrap(inner: Store) -> Store:
        made.append(FaultyStore(inner, fail_at="reserve_execution", when="after_commit", times=1))
        return made[-1]

    config = {**gateway_config(tmp_path, tools_upstream.url), "auth": auth_table()}
    snapshot = snapshot_from_mapping(config, source=None, version="lost-ack")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data", store_factory=wrap))
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        gateway: Gateway = app.state.gateway
        before = counter_value(counter)
        failed = await sessionless_call(http, url, "tools__increment", execution_id="lost-ack")
        assert reason_of(failed) == "not_durable", failed
        await wait_until_recovered(http, url)
        assert gateway.store is not None
        record = await gateway.store.get_execution(AgentId("alice"), ExecutionId("lost-ack"))
        assert record is not None and record.state is ExecutionState.OUTCOME_UNKNOWN
        retry = await sessionless_call(http, url, "tools__increment", execution_id="lost-ack")
        assert reason_of(retry) == "execution_replay", retry
        assert retry["error"]["data"]["earlier_outcome"] == "outcome_unknown"
    assert counter_value(counter) == before  # never sent, never re-sent
    owed = [(e["event"], e["reason"]) for e in entries_with(tmp_path / "data", "lost-ack") if e["detail"]]
    assert ("outcome_unknown", "admission_write_failed") in owed, owed


def entries_of_call(data_dir: Path, call_id: str) -> list[dict[str, Any]]:
    """Every audit entry of one attempt, across chains (read-only, straight from the SQLite file)."""
    uri = f"file:{data_dir / 'bastion.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute(
            "SELECT entry FROM entries WHERE json_extract(entry, '$.call_id') = ?", (call_id,)
        ).fetchall()
    return [orjson.loads(row[0]) for row in rows]


async def test_refusals_while_degraded_reach_the_audit_once_storage_returns(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Every refusal is an audit entry (DESIGN §2): one made while degraded is written once storage is up."""
    async with (
        faulty_gateway(tmp_path, tools_upstream.url, "before_commit") as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        failed = await sessionless_call(http, gw.url, "tools__increment", execution_id="degraded-1")
        assert reason_of(failed) == "not_durable"
        refused = await sessionless_call(
            http, gw.url, "tools__echo", {"text": "x"}, execution_id="degraded-2"
        )
        assert reason_of(refused) == "not_durable"
        gw.faulty.recover()
        await wait_until_recovered(http, gw.url)
        entries = entries_of_call(gw.data_dir, receipt_of(refused)["call_id"])
    assert [(e["event"], e["reason"], e["execution_id"]) for e in entries] == [
        ("refused", "not_durable", "degraded-2")
    ]


async def test_a_sessionless_result_is_withheld_when_its_evidence_cannot_be_written(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A sessionless call's entries are durable before the answer; if they cannot be, no success is shown."""
    made: list[FaultyStore] = []

    def wrap(inner: Store) -> Store:
        made.append(FaultyStore(inner, fail_at="open_chain", when="before_commit", times=1))
        return made[-1]

    config = {**gateway_config(tmp_path, tools_upstream.url), "auth": auth_table()}
    snapshot = snapshot_from_mapping(config, source=None, version="d")
    options = RuntimeOptions(
        data_dir=tmp_path / "data", store_factory=wrap, sessionless_evidence_max_age_s=SESSIONLESS_MAX_AGE_S
    )
    app = create_app(snapshot, options)
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        failed = await sessionless_call(http, url, "tools__echo", {"text": "x"})
        assert reason_of(failed) == "not_durable", failed
        assert "result" not in failed
        detail = await wait_until_recovered(http, url)
        assert detail["store"]["audit_owed"] == 0
        # The owed entries were written once storage returned, into a chain that closes with a claim.
        owed = entries_of_call(tmp_path / "data", receipt_of(failed)["call_id"])
        assert [(e["event"], e["detail"]["late"]) for e in owed] == [("admitted", True), ("completed", True)]
        await wait_for_claim(http, url, owed[0]["session_id"])
        ok = await sessionless_call(http, url, "tools__echo", {"text": "y"})
    assert ok["result"]["content"][0]["text"] == "y"
