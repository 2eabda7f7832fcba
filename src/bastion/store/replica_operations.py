"""The :class:`~bastion.store.replicas.ReplicaRecords` methods over any engine (issue #10).

A mixin of :class:`~bastion.store.operations.StoreOperations`: each method
checks its arguments and hands an operation of ``store/ops/replicas.py`` to
the engine's ``_write`` (one atomic, durable transaction) or ``_read``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from bastion.ids import Epoch, WorkerId
from bastion.store.ops import replicas
from bastion.store.replicas import Change, ChangeKind, PolicyReport, TransportSessionRecord
from bastion.store.rows import dumps, to_us
from bastion.store.statements import OpFactory

__all__ = ["ReplicaRecordOperations"]

T = TypeVar("T")


class ReplicaRecordOperations:
    """Transport session records, the change feed and policy reports, over ``_write``/``_read``."""

    async def _write(self, op: OpFactory[T]) -> T:
        raise NotImplementedError

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        raise NotImplementedError

    async def create_transport_session(
        self, record: TransportSessionRecord, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        values = (
            record.key, record.agent, record.agent_session_id, record.credential_id, record.protocol_version,
            dumps(dict(record.client_capabilities)), dumps(dict(record.client_info)),
            to_us(record.created_at), to_us(record.last_seen_at), writer,
        )  # fmt: skip
        await self._write(lambda: replicas.create_transport_session(values, record.key, writer, epoch))

    async def get_transport_session(self, key: str) -> TransportSessionRecord | None:
        return await self._read(lambda: replicas.get_transport_session(key))

    async def list_transport_sessions(self, *, seen_since: datetime) -> list[TransportSessionRecord]:
        since_us = to_us(seen_since)
        return await self._read(lambda: replicas.list_transport_sessions(since_us))

    async def touch_transport_sessions(
        self, keys: Sequence[str], now: datetime, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        wanted, now_us = sorted(set(keys)), to_us(now)
        if wanted:
            await self._write(lambda: replicas.touch_transport_sessions(wanted, now_us, writer, epoch))

    async def terminate_transport_session(self, key: str, reason: str, now: datetime) -> bool:
        now_us = to_us(now)
        return await self._write(lambda: replicas.terminate_transport_session(key, reason, now_us))

    async def publish_change(
        self, kind: ChangeKind, subject: str, detail: Mapping[str, Any] | None, *, origin: WorkerId
    ) -> int:
        detail_json = None if detail is None else dumps(dict(detail))
        now_us = to_us(datetime.now(UTC))
        return await self._write(lambda: replicas.publish_change(kind, subject, detail_json, origin, now_us))

    async def changes_after(self, seq: int, *, limit: int = 500) -> list[Change]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._read(lambda: replicas.changes_after(seq, limit))

    async def latest_change(self) -> int:
        return await self._read(replicas.latest_change)

    async def prune_changes(self, before: datetime) -> int:
        before_us = to_us(before)
        return await self._write(lambda: replicas.prune_changes(before_us))

    async def report_policy(
        self, version: str, reload_error: str | None, now: datetime, *, writer: WorkerId, epoch: Epoch
    ) -> None:
        now_us = to_us(now)
        await self._write(lambda: replicas.report_policy(version, reload_error, now_us, writer, epoch))

    async def list_policy_reports(self) -> list[PolicyReport]:
        return await self._read(replicas.list_policy_reports)
