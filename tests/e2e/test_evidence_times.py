"""Evidence with true times, and a call at the upstream when its gateway dies (issue #25, DESIGN 2 and 4).

A real ``bastion serve`` relays ``hold`` (a tool that is not ``readOnlyHint``) without an
execution id to ``tests/e2e/holding_upstream.py``, which answers when the test releases it.
The ``admitted`` entry is in the store while the upstream holds the call, stamped with the
time it was admitted; the outcome is stamped when the answer came, about 3 s later. Killed
with SIGKILL while the call is held, the restarted gateway writes the call's
``outcome_unknown`` entry (reason ``recovery``) naming that ``admitted`` entry.
"""

from __future__ import annotations

import contextlib
import signal
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx
import pytest

from bastion.audit.entry import AuditEntry
from tests.e2e.test_shared_evidence_crash import bastion_serve
from tests.e2e.test_workers_e2e import (
    HoldingUpstream,
    all_chains,
    holding_upstream,
    raw_call,
    write_config,
)

pytestmark = pytest.mark.anyio

__all__ = ["holding_upstream"]  # the fixture, used by name

HOLD_TIMEOUT_S = 30.0
HELD_S = 3.0


def entries_of(data_dir: Path, event: str, tool: str = "hold") -> list[AuditEntry]:
    return [
        entry
        for chain in all_chains(data_dir).values()
        for entry, _, _ in chain
        if entry.event == event and entry.tool == tool
    ]


def ts(entry: AuditEntry) -> datetime:
    return datetime.fromisoformat(entry.ts)


async def test_a_mutating_call_is_admitted_durably_before_it_is_sent_and_each_entry_has_its_own_time(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """While the upstream holds the call the admitted entry is in the store; completed comes ≈3 s later."""
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url)
    data_dir = tmp_path / "data"
    answers: list[httpx.Response] = []
    async with (
        httpx.AsyncClient(timeout=60) as http,
        bastion_serve(config, data_dir, tmp_path / "gateway.log") as (_, url),
        anyio.create_task_group() as tg,
    ):

        async def call() -> None:
            answers.append(await raw_call(http, url, "work__hold"))

        sent = datetime.now(UTC)
        tg.start_soon(call)
        with anyio.fail_after(HOLD_TIMEOUT_S):
            assert await holding_upstream.next_hold() == 1
        held = datetime.now(UTC)
        [admitted] = entries_of(data_dir, "admitted")  # durable before the upstream got the call
        assert entries_of(data_dir, "completed") == []
        assert sent <= ts(admitted) <= held
        await anyio.sleep(HELD_S)
        await holding_upstream.release()
    assert answers[0].status_code == 200 and "result" in answers[0].json()
    [completed] = entries_of(data_dir, "completed")
    assert completed.call_id == admitted.call_id
    assert completed.seq == admitted.seq + 1
    ran_s = (ts(completed) - ts(admitted)).total_seconds()
    assert HELD_S - 0.1 <= ran_s <= HELD_S + 10


async def test_a_read_only_call_keeps_its_admission_time_though_written_with_its_outcome(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """``count`` is read-only: both entries are written after the answer, each with its own time."""
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url)
    data_dir = tmp_path / "data"
    async with (
        httpx.AsyncClient(timeout=60) as http,
        bastion_serve(config, data_dir, tmp_path / "gateway.log") as (_, url),
    ):
        response = await raw_call(http, url, "work__count")
    assert response.status_code == 200
    [admitted] = entries_of(data_dir, "admitted", tool="count")
    [completed] = entries_of(data_dir, "completed", tool="count")
    assert (admitted.seq, admitted.call_id) == (completed.seq - 1, completed.call_id)
    assert admitted.ts < completed.ts


async def test_sigkill_while_a_mutating_call_is_at_the_upstream_leaves_it_visible_and_recovery_closes_it(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """kill -9 with ``hold`` at the upstream: after restart the chain shows admitted, then outcome_unknown."""
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url)
    data_dir = tmp_path / "data"
    log = tmp_path / "gateway.log"
    async with httpx.AsyncClient(timeout=60) as http:
        async with bastion_serve(config, data_dir, log) as (first, url), anyio.create_task_group() as tg:

            async def call() -> None:
                with contextlib.suppress(httpx.HTTPError):  # the gateway dies under it
                    await raw_call(http, url, "work__hold")

            sent = datetime.now(UTC)
            tg.start_soon(call)
            with anyio.fail_after(HOLD_TIMEOUT_S):
                assert await holding_upstream.next_hold() == 1
            first.send_signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        [admitted] = entries_of(data_dir, "admitted")
        assert entries_of(data_dir, "outcome_unknown") == []
        async with bastion_serve(config, data_dir, log):
            [unknown] = entries_of(data_dir, "outcome_unknown")  # recovered before it served
    assert sent <= ts(admitted) <= ts(unknown)
    assert unknown.call_id == admitted.call_id and unknown.execution_id is None
    assert (unknown.reason, unknown.outcome) == ("recovery", "outcome_unknown")
    for name in ("server", "tool", "binding", "args_digest"):
        assert getattr(unknown, name) == getattr(admitted, name), name
    assert unknown.detail is not None
    assert unknown.detail["previous_state"] == "admitted"
    assert unknown.detail["last_entry"] == {
        "session_id": admitted.session_id,
        "seq": admitted.seq,
        "hash": admitted.hash,
        "ts": admitted.ts,
    }
    assert holding_upstream.count() == 1
