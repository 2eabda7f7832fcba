"""Pass :class:`~bastion.store.approvals.ApprovalStore` through a wrapping store unchanged (issue 27)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from bastion.store.approvals import ApprovalRecord, ApprovalState, ApprovalStore, NewApproval

__all__ = ["ApprovalStorePassthrough"]


class _Wrapper(Protocol):
    @property
    def inner(self) -> ApprovalStore: ...


class ApprovalStorePassthrough:
    """Mixin: every approval call goes to ``self.inner``."""

    async def request_approval(
        self: _Wrapper, request: NewApproval, *, now: datetime
    ) -> tuple[ApprovalRecord, bool]:
        return await self.inner.request_approval(request, now=now)

    async def get_approval(self: _Wrapper, approval_id: str) -> ApprovalRecord | None:
        return await self.inner.get_approval(approval_id)

    async def list_approvals(
        self: _Wrapper, *, state: ApprovalState | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        return await self.inner.list_approvals(state=state, limit=limit)

    async def decide_approval(
        self: _Wrapper,
        approval_id: str,
        state: ApprovalState,
        *,
        by: str | None,
        note: str | None,
        now: datetime,
    ) -> tuple[ApprovalRecord, bool] | None:
        return await self.inner.decide_approval(approval_id, state, by=by, note=note, now=now)
