"""The approval contract (``store/approvals.py``) over any engine's ``_write`` and ``_read`` (issue 27)."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import TypeVar

from bastion.store.approvals import ApprovalRecord, ApprovalState, NewApproval
from bastion.store.ops import approvals
from bastion.store.rows import to_us
from bastion.store.statements import OpFactory

__all__ = ["ApprovalOperations", "new_approval_id"]

T = TypeVar("T")


def new_approval_id() -> str:
    """A fresh approval id: 128 random bits, nothing of the call or its owner."""
    return "apr_" + secrets.token_hex(16)


class ApprovalOperations:
    """Mixin of :class:`~bastion.store.operations.StoreOperations`: the approval methods."""

    async def _write(self, op: OpFactory[T]) -> T:
        raise NotImplementedError

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        raise NotImplementedError

    async def request_approval(self, request: NewApproval, *, now: datetime) -> tuple[ApprovalRecord, bool]:
        approval_id, now_us, expires_us = new_approval_id(), to_us(now), to_us(request.expires_at)
        return await self._write(lambda: approvals.request_approval(approval_id, request, now_us, expires_us))

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return await self._read(lambda: approvals.get_approval(approval_id))

    async def list_approvals(
        self, *, state: ApprovalState | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        chosen = None if state is None else ApprovalState(state)
        return await self._read(lambda: approvals.list_approvals(chosen, limit))

    async def decide_approval(
        self, approval_id: str, state: ApprovalState, *, by: str | None, note: str | None, now: datetime
    ) -> tuple[ApprovalRecord, bool] | None:
        state = ApprovalState(state)
        if state is ApprovalState.PENDING:
            raise ValueError("a decision moves a request out of pending")
        if state in (ApprovalState.APPROVED, ApprovalState.DENIED) and not by:
            raise ValueError("an approver's decision names the approver")
        now_us = to_us(now)
        return await self._write(lambda: approvals.decide_approval(approval_id, state, by, note, now_us))
