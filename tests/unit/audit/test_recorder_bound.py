"""The exact entry bound with concurrent calls (issue #11 point 14): a call that does not fit waits, whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskStatus

from bastion.audit.chain import CloseReason
from bastion.audit.claim import PolicyInForce
from bastion.audit.entry import AuditEntry, AuditEvent
from bastion.audit.recorder import EvidenceRecorder, EvidenceSession
from bastion.audit.tee import no_attestation
from bastion.crypto.keys import Keyring
from bastion.ids import AgentId
from bastion.store.sqlite import SqliteStore
from bastion.workers.membership import WorkerMembership
from tests.unit.audit.conftest import PROFILE

pytestmark = pytest.mark.anyio


@pytest.fixture
async def recorder(tmp_path: Path) -> AsyncIterator[EvidenceRecorder]:
    store = await SqliteStore.open(tmp_path / "bastion.db")
    membership = WorkerMembership(
        store, "gateway-0", lease_s=30.0, heartbeat_s=1.0, clock=lambda: datetime.now(UTC)
    )
    await membership.join(config_version="t")
    try:
        yield EvidenceRecorder(
            store,
            Keyring.open(tmp_path),
            membership,
            attest=lambda root: no_attestation("no TEE in tests"),
            profile=PROFILE,
            policy=lambda: PolicyInForce(bundle_hash="sha256:" + "cd" * 32),
            max_entries=6,
        )
    finally:
        await store.aclose()


def _first_half(call_id: str) -> list[tuple[AuditEvent, dict[str, Any]]]:
    return [(AuditEvent.ADMITTED, {"call_id": call_id}), (AuditEvent.INVOKING, {"call_id": call_id})]


async def _start_call(
    recorder: EvidenceRecorder,
    evidence: EvidenceSession,
    call_id: str,
    out: list[AuditEntry],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    out.extend(await recorder.append_many(evidence, _first_half(call_id), then=1))


async def test_a_call_that_does_not_fit_waits_for_the_holder_then_rotates(recorder: EvidenceRecorder) -> None:
    """B cannot fit beside A's held slot: it waits, A finishes in the first chain, B starts the next one."""
    evidence = await recorder.open(AgentId("alice"))
    first = evidence.session_id
    a = await recorder.append_many(evidence, _first_half("a"), then=1)
    b: list[AuditEntry] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(_start_call, recorder, evidence, "b", b)
            await anyio.wait_all_tasks_blocked()
            assert b == []  # waiting for A's hold
            a_done = await recorder.append_many(evidence, [(AuditEvent.COMPLETED, {"call_id": "a"})])
    assert {e.session_id for e in [*a, *a_done]} == {first}
    assert [e.seq for e in [*a, *a_done]] == [2, 3, 4]
    assert {e.session_id for e in b} == {evidence.session_id} != {first}
    assert await recorder.close(evidence, CloseReason.SHUTDOWN) is not None


async def test_a_waiting_call_cancelled_leaves_the_chain_usable(recorder: EvidenceRecorder) -> None:
    """Cancelling a call while it waits for room releases nothing it did not hold; the next call proceeds."""
    evidence = await recorder.open(AgentId("alice"))
    await recorder.append_many(evidence, _first_half("a"), then=1)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(_start_call, recorder, evidence, "b", [])
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        recorder.end_call(evidence, "a")  # A ended without its last entry (e.g. an owed write)
        c = await recorder.append_many(evidence, _first_half("c"), then=1)
    assert c[0].seq == 2  # a fresh chain: A's chain rotated out once its hold ended
