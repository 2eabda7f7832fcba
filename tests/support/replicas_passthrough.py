"""Pass :class:`~bastion.store.replicas.ReplicaRecords` through a wrapping store unchanged (issue #10).

``FaultyStore`` injects faults into the execution, audit and admin writes; the
replica records (transport sessions, change feed, policy reports) reach the
inner store untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from bastion.ids import Epoch, WorkerId
from bastion.store.replicas import Change, ChangeKind, PolicyReport, ReplicaRecords, TransportSessionRecord

__all__ = ["ReplicaRecordsPassthrough"]


class _Wrapper(Protocol):
    @property
    def inner(self) -> ReplicaRecords: ...


class ReplicaRecordsPassthrough:
    """Mixin: every replica-record call goes to ``self.inner``."""

    async def create_transport_session(
        self: _Wrapper, record: TransportSessionRecord, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        await self.inner.create_transport_session(record, writer=writer, epoch=epoch)

    async def get_transport_session(self: _Wrapper, key: str) -> TransportSessionRecord | None:
        return await self.inner.get_transport_session(key)

    async def list_transport_sessions(
        self: _Wrapper, *, seen_since: datetime
    ) -> list[TransportSessionRecord]:
        return await self.inner.list_transport_sessions(seen_since=seen_since)

    async def touch_transport_sessions(
        self: _Wrapper, keys: Sequence[str], now: datetime, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        await self.inner.touch_transport_sessions(keys, now, writer=writer, epoch=epoch)

    async def terminate_transport_session(self: _Wrapper, key: str, reason: str, now: datetime) -> bool:
        return await self.inner.terminate_transport_session(key, reason, now)

    async def publish_change(
        self: _Wrapper, kind: ChangeKind, subject: str, detail: Mapping[str, Any] | None, *, origin: WorkerId
    ) -> int:
        return await self.inner.publish_change(kind, subject, detail, origin=origin)

    async def changes_after(self: _Wrapper, seq: int, *, limit: int = 500) -> list[Change]:
        return await self.inner.changes_after(seq, limit=limit)

    async def latest_change(self: _Wrapper) -> int:
        return await self.inner.latest_change()

    async def prune_changes(self: _Wrapper, before: datetime) -> int:
        return await self.inner.prune_changes(before)

    async def report_policy(
        self: _Wrapper,
        version: str,
        reload_error: str | None,
        now: datetime,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> None:
        await self.inner.report_policy(version, reload_error, now, writer=writer, epoch=epoch)

    async def list_policy_reports(self: _Wrapper) -> list[PolicyReport]:
        return await self.inner.list_policy_reports()
