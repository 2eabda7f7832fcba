"""Storage failures leave evidence (issue #11 point 12): the refusal that trips degraded mode is audited,
and every entry written late carries both its write time (``ts``) and its event time (``detail.event_ts``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest

from bastion.app import create_app
from bastion.cli.main import main
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.store.base import Store
from tests.e2e.conftest import Upstream, gateway_config
from tests.e2e.issue4_support import auth_table
from tests.e2e.test_evidence_e2e import reason_of, receipt_of, sessionless_call
from tests.e2e.test_execution_durability import entries_of_call, faulty_gateway, wait_until_recovered
from tests.support.faulty_store import FaultyStore
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


async def test_the_refusal_that_trips_degraded_mode_is_audited_late_with_its_event_time(
    tmp_path: Path, tools_upstream: Upstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reservation that cannot be made durable is refused; the refusal is audited when storage returns."""
    made: list[FaultyStore] = []

    def wrap(inner: Store) -> Store:
        made.append(FaultyStore(inner, fail_at="reserve_execution", times=1))
        return made[-1]

    config = {**gateway_config(tmp_path, tools_upstream.url), "auth": auth_table()}  # /readyz detail
    snapshot = snapshot_from_mapping(config, source=None, version="trip")
    data_dir = tmp_path / "data"
    app = create_app(snapshot, RuntimeOptions(data_dir=data_dir, store_factory=wrap))
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        tripped = await sessionless_call(http, url, "tools__echo", {"text": "x"}, execution_id="trip-1")
        assert reason_of(tripped) == "not_durable", tripped
        assert made[0].injected == 1
        await wait_until_recovered(http, url)
        entries = entries_of_call(data_dir, receipt_of(tripped)["call_id"])
    assert [(e["event"], e["reason"], e["execution_id"], e["decision"]) for e in entries] == [
        ("refused", "not_durable", "trip-1", "deny")
    ]
    detail = entries[0]["detail"]
    assert detail["late"] is True
    assert _parse(detail["event_ts"]) <= _parse(entries[0]["ts"])
    # `bastion audit find` reaches it through the real entry point (its own event loop: a thread).
    find = ["audit", "find", "--data-dir", str(data_dir), "--execution-id", "trip-1"]
    assert await anyio.to_thread.run_sync(main, find) == 0
    out = capsys.readouterr().out
    assert "event=refused" in out and f"late event_ts={detail['event_ts']}" in out


async def test_an_owed_outcome_carries_its_event_time_and_its_write_time(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """An outcome owed while storage was down is written with its write time (ts) and event time."""
    async with (
        faulty_gateway(tmp_path, tools_upstream.url, "before_commit") as gw,
        httpx.AsyncClient(timeout=30) as http,
    ):
        failed = await sessionless_call(http, gw.url, "tools__increment", execution_id="late-1")
        assert reason_of(failed) == "not_durable", failed
        gw.faulty.recover()
        await wait_until_recovered(http, gw.url)
        entries = entries_of_call(gw.data_dir, receipt_of(failed)["call_id"])
    late = [e for e in entries if (e["detail"] or {}).get("late")]
    # The refusal the client was given, then the outcome this replica observed (issue #23).
    assert [(e["event"], e["reason"]) for e in late] == [
        ("refused", "terminal_write_failed"),
        ("completed", None),
    ]
    for entry in late:
        assert _parse(entry["detail"]["event_ts"]) <= _parse(entry["ts"])
