"""approvals/waiters.py: a wake reaches the waiter of that approval only, and a wait is bounded."""

from __future__ import annotations

import anyio
import pytest

from bastion.approvals.waiters import ApprovalWaiters

pytestmark = pytest.mark.anyio


async def test_a_wake_ends_only_its_own_wait_and_leaves_nothing_behind() -> None:
    waiters = ApprovalWaiters()
    woken: list[str] = []

    async def wait(approval_id: str) -> None:
        await waiters.wait(approval_id, 30)
        woken.append(approval_id)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "apr_a")
            tg.start_soon(wait, "apr_b")
            while len(waiters) < 2:
                await anyio.sleep(0)
            waiters.wake("apr_a")
            while not woken:
                await anyio.sleep(0)
            assert woken == ["apr_a"]
            waiters.wake("apr_b")
    assert len(waiters) == 0


async def test_an_unwoken_wait_ends_at_its_bound() -> None:
    waiters = ApprovalWaiters()
    with anyio.fail_after(5):
        await waiters.wait("apr_a", 0.01)
    assert len(waiters) == 0
