"""The store contract, written once over any engine that can run an operation.

:class:`StoreOperations` implements every method of :class:`~bastion.store.base.Store`
by checking its arguments and handing an operation (``store/ops/``) to the
engine: :meth:`_write` runs it in one atomic, durable write transaction,
:meth:`_read` against committed data (``snapshot=True``: in one read
transaction, so related rows agree). An engine subclasses it and supplies
those two, ``aclose`` and its constructor; nothing else.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import anyio

from bastion.admission.states import ExecutionState
from bastion.audit.entry import AuditEntry
from bastion.errors import StoreError
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.approval_operations import ApprovalOperations
from bastion.store.base import (
    AgentSessionRecord,
    AppendBuilder,
    AttachmentRecord,
    ChainInfo,
    CredentialKind,
    CredentialRecord,
    ExecutionRecord,
    ExecutionStep,
    GenerationBacklog,
    GenerationRecord,
    RecoveredExecution,
    ReserveOutcome,
    StoreOwner,
    WorkerRecord,
)
from bastion.store.ops import agent_sessions, chains, executions, owners, token_buckets, workers
from bastion.store.pin_operations import PinOperations
from bastion.store.replica_operations import ReplicaRecordOperations
from bastion.store.rows import (
    SELECT_CHAIN,
    SELECT_GENERATION,
    chain_from_row,
    check_binding,
    check_digest,
    dumps,
    from_us,
    generation_from_row,
    to_us,
)
from bastion.store.statements import Op, OpFactory, one, rows
from bastion.store.task_operations import TaskOperations
from bastion.store.token_buckets import BucketTake, TokensRefused

__all__ = ["StoreOperations"]

T = TypeVar("T")


class StoreOperations(ReplicaRecordOperations, TaskOperations, ApprovalOperations, PinOperations):
    """Every contract method, over :meth:`_write` and :meth:`_read`."""

    async def _write(self, op: OpFactory[T]) -> T:
        raise NotImplementedError

    async def _read(self, op: OpFactory[T], *, snapshot: bool = False) -> T:
        raise NotImplementedError

    # ------------------------------------------------------------ workers and fencing

    async def register_worker(
        self, worker_id: WorkerId, role: str, provenance: Mapping[str, Any], *, now: datetime
    ) -> WorkerRecord:
        provenance_json, now_us = dumps(provenance), to_us(now)
        return await self._write(lambda: workers.register_worker(worker_id, role, provenance_json, now_us))

    async def claim_generation(
        self, generation: str, worker_id: WorkerId, *, now: datetime, lease_s: float
    ) -> Epoch:
        now_us = to_us(now)
        if not lease_s > 0:
            raise ValueError("lease_s must be positive")
        lease_us = int(lease_s * 1_000_000)
        return await self._write(lambda: workers.claim_generation(generation, worker_id, now_us, lease_us))

    async def heartbeat(self, worker_id: WorkerId, now: datetime) -> None:
        now_us = to_us(now)
        await self._write(lambda: workers.heartbeat(worker_id, now_us))

    async def get_worker(self, worker_id: WorkerId) -> WorkerRecord | None:
        return await self._read(lambda: workers.select_worker(worker_id))

    async def get_generation(self, generation: str) -> GenerationRecord | None:
        def op() -> Op[GenerationRecord | None]:
            row = yield from one(SELECT_GENERATION + " WHERE generation = ?", generation)
            return None if row is None else generation_from_row(row)

        return await self._read(op)

    # ------------------------------------------------------------ ownership and health (issue #23)

    async def probe(self, timeout_s: float) -> None:
        try:
            with anyio.fail_after(timeout_s):
                await self._read(owners.probe)
        except TimeoutError:
            raise StoreError("the store did not answer", cause=f"no answer within {timeout_s:g} s") from None

    async def store_owners(self) -> list[StoreOwner]:
        found = await self._read(owners.list_owners)
        return [StoreOwner(str(key), str(where), from_us(int(us))) for key, where, us in found]

    async def add_store_owner(self, key_id: str, data_dir: str, *, now: datetime) -> None:
        now_us = to_us(now)
        await self._write(lambda: owners.add_owner(key_id, data_dir, now_us))

    # ------------------------------------------------------------ worker registry

    async def list_workers(self) -> list[WorkerRecord]:
        return await self._read(workers.list_workers)

    async def list_generations(self) -> list[GenerationRecord]:
        def op() -> Op[list[GenerationRecord]]:
            found = yield from rows(SELECT_GENERATION + " ORDER BY generation")
            return [generation_from_row(row) for row in found]

        return await self._read(op)

    async def withdraw_liveness(self, worker_id: WorkerId, *, now: datetime, reason: str) -> WorkerRecord:
        return await self._end_liveness(worker_id, workers.WITHDRAW_LIVENESS, reason, now)

    async def mark_worker_failed(self, worker_id: WorkerId, reason: str, now: datetime) -> WorkerRecord:
        return await self._end_liveness(worker_id, workers.MARK_FAILED, reason, now)

    async def _end_liveness(
        self, worker_id: WorkerId, update: str, reason: str, now: datetime
    ) -> WorkerRecord:
        if not reason:
            raise ValueError("ending a worker's liveness needs a reason")
        now_us = to_us(now)
        return await self._write(lambda: workers.end_liveness(worker_id, update, reason, now_us))

    async def generation_backlog(self, generation: str) -> GenerationBacklog:
        return await self._read(lambda: workers.generation_backlog(generation), snapshot=True)

    async def record_attachment(
        self,
        worker_id: WorkerId,
        transport_session_ref: str,
        namespace: str,
        now: datetime,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> AttachmentRecord:
        if not transport_session_ref or not namespace:
            raise ValueError("an attachment names a transport session reference and a namespace")
        now_us = to_us(now)
        return await self._write(
            lambda: workers.record_attachment(
                worker_id, transport_session_ref, namespace, now_us, writer, epoch
            )
        )

    async def clear_attachment(
        self,
        worker_id: WorkerId,
        transport_session_ref: str,
        namespace: str,
        *,
        writer: WorkerId,
        epoch: Epoch,
    ) -> bool:
        return await self._write(
            lambda: workers.clear_attachment(worker_id, transport_session_ref, namespace, writer, epoch)
        )

    async def list_attachments(
        self, worker_id: WorkerId | None = None, *, transport_session_ref: str | None = None
    ) -> list[AttachmentRecord]:
        return await self._read(lambda: workers.list_attachments(worker_id, transport_session_ref))

    # ------------------------------------------------------------ executions

    async def reserve_execution(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        binding: str,
        *,
        call_id: CallId,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ReserveOutcome:
        check_binding(binding)
        return await self._write(
            lambda: executions.reserve_execution(agent, execution_id, binding, call_id, worker, epoch)
        )

    async def mark_invoking(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        target = ExecutionState.INVOKING
        return await self._write(lambda: executions.transition(agent, execution_id, target, worker, epoch))

    async def record_outcome(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        outcome: ExecutionState,
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ExecutionRecord:
        if not outcome.is_terminal:
            raise ValueError(f"record_outcome needs a terminal state, not {outcome.value}")
        return await self._write(lambda: executions.transition(agent, execution_id, outcome, worker, epoch))

    async def release_execution(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        target = ExecutionState.RELEASED
        return await self._write(lambda: executions.transition(agent, execution_id, target, worker, epoch))

    async def get_execution(self, agent: AgentId, execution_id: ExecutionId) -> ExecutionRecord | None:
        return await self._read(lambda: executions.select_execution(agent, execution_id))

    async def recover_worker(
        self, dead_worker_generation: str, *, new_worker: WorkerId, new_epoch: Epoch
    ) -> list[RecoveredExecution]:
        return await self._write(
            lambda: executions.recover_worker(dead_worker_generation, new_worker, new_epoch)
        )

    # ------------------------------------------------------------ audit chains

    async def open_chain(
        self,
        session_id: EvidenceSessionId,
        genesis: AuditEntry,
        *,
        worker: WorkerId,
        epoch: Epoch,
        then: Sequence[AuditEntry] = (),
        closed_with_claim: Mapping[str, Any] | None = None,
        step: ExecutionStep | None = None,
    ) -> ChainInfo:
        following = tuple(then)
        return await self._write(
            lambda: chains.open_chain(session_id, genesis, worker, epoch, following, closed_with_claim, step)
        )

    async def append_entry(
        self, session_id: EvidenceSessionId, build: AppendBuilder, *, worker: WorkerId, epoch: Epoch
    ) -> AuditEntry:
        appended = await self._write(lambda: chains.append_entries(session_id, (build,), worker, epoch))
        return appended[0]

    async def append_entries(
        self,
        session_id: EvidenceSessionId,
        builds: Sequence[AppendBuilder],
        *,
        worker: WorkerId,
        epoch: Epoch,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        return await self._write(lambda: chains.append_entries(session_id, builds, worker, epoch, step))

    async def read_chain(
        self, session_id: EvidenceSessionId, *, start_seq: int = 0, limit: int | None = None
    ) -> list[AuditEntry]:
        sql = "SELECT entry FROM entries WHERE session_id = ? AND seq >= ? ORDER BY seq"
        params: tuple[Any, ...] = (session_id, start_seq)
        if limit is not None:
            sql, params = sql + " LIMIT ?", (*params, max(limit, 0))

        def op() -> Op[list[AuditEntry]]:
            found = yield from rows(sql, *params)
            return [AuditEntry.from_json(json.loads(row[0])) for row in found]

        return await self._read(op)

    async def get_chain(self, session_id: EvidenceSessionId) -> ChainInfo | None:
        return await self._read(lambda: chains.select_chain(session_id))

    async def find_entries(
        self, execution_id: ExecutionId, *, agent: AgentId | None = None, limit: int = 10_000
    ) -> list[AuditEntry]:
        sql = "SELECT entry FROM entries WHERE execution_id = ?"
        params: tuple[Any, ...] = (execution_id,)
        if agent is not None:
            sql, params = sql + " AND agent = ?", (*params, agent)
        sql, params = sql + " ORDER BY session_id, seq LIMIT ?", (*params, max(limit, 0))

        def op() -> Op[list[AuditEntry]]:
            found = yield from rows(sql, *params)
            entries = [AuditEntry.from_json(json.loads(row[0])) for row in found]
            return sorted(entries, key=lambda e: (e.ts, e.session_id, e.seq))

        return await self._read(op)

    async def list_open_chains(self, *, generation: str | None = None) -> list[ChainInfo]:
        def op() -> Op[list[ChainInfo]]:
            if generation is None:
                found = yield from rows(SELECT_CHAIN + " WHERE closed = 0 ORDER BY session_id")
            else:
                found = yield from rows(
                    SELECT_CHAIN + " WHERE closed = 0 AND generation = ? ORDER BY session_id", generation
                )
            return [chain_from_row(row) for row in found]

        return await self._read(op)

    async def close_chain(
        self,
        session_id: EvidenceSessionId,
        *,
        worker: WorkerId,
        epoch: Epoch,
        final: AppendBuilder | None = None,
        claim_for: Callable[[AuditEntry], Mapping[str, Any]] | None = None,
    ) -> ChainInfo:
        return await self._write(lambda: chains.close_chain(session_id, worker, epoch, final, claim_for))

    async def store_claim(
        self,
        session_id: EvidenceSessionId,
        claim: Mapping[str, Any],
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> None:
        claim_json = dumps(claim)
        await self._write(lambda: chains.store_claim(session_id, claim_json, worker, epoch))

    async def get_claim(self, session_id: EvidenceSessionId) -> dict[str, Any] | None:
        def op() -> Op[dict[str, Any] | None]:
            row = yield from one("SELECT claim FROM claims WHERE session_id = ?", session_id)
            return None if row is None else dict(json.loads(row[0]))

        return await self._read(op)

    # ------------------------------------------------------------ agent sessions and credentials

    async def create_agent_session(
        self,
        *,
        human: str,
        agent: AgentId,
        team: str | None,
        scopes: frozenset[str],
        now: datetime,
        expires_at: datetime,
    ) -> AgentSessionRecord:
        if not human or not agent or team == "":
            raise ValueError("human and agent must be non-empty, team non-empty or None")
        created_us, expires_us = to_us(now), to_us(expires_at)
        if expires_us <= created_us:
            raise ValueError("an agent session must expire after it is created")
        agent_session_id = "as_" + secrets.token_hex(16)
        scopes_json = dumps(sorted(scopes))
        return await self._write(
            lambda: agent_sessions.create_agent_session(
                agent_session_id, human, agent, team, scopes_json, created_us, expires_us
            )
        )

    async def add_credential(
        self, agent_session_id: str, kind: CredentialKind, digest: str, *, now: datetime
    ) -> CredentialRecord:
        kind = CredentialKind(kind)
        check_digest(digest)
        now_us = to_us(now)
        return await self._write(
            lambda: agent_sessions.add_credential(agent_session_id, kind, digest, now, now_us)
        )

    async def find_credential(
        self, kind: CredentialKind, digest: str
    ) -> tuple[CredentialRecord, AgentSessionRecord] | None:
        kind = CredentialKind(kind)
        return await self._read(lambda: agent_sessions.find_credential(kind, digest), snapshot=True)

    async def get_agent_session(self, agent_session_id: str) -> AgentSessionRecord | None:
        return await self._read(lambda: agent_sessions.select_agent_session(agent_session_id))

    async def list_agent_sessions(self, *, agent: AgentId | None = None) -> list[AgentSessionRecord]:
        return await self._read(lambda: agent_sessions.list_agent_sessions(agent))

    async def list_credentials(self, agent_session_id: str) -> list[CredentialRecord]:
        return await self._read(lambda: agent_sessions.list_credentials(agent_session_id))

    async def revoke_agent_session(
        self, agent_session_id: str, *, by: str, reason: str, now: datetime
    ) -> AgentSessionRecord:
        if not by:
            raise ValueError("a revocation names who revoked")
        now_us = to_us(now)
        return await self._write(
            lambda: agent_sessions.revoke_agent_session(agent_session_id, by, reason, now_us)
        )

    async def renew_credential(
        self, old_credential_id: str, new_digest: str, *, now: datetime
    ) -> CredentialRecord:
        check_digest(new_digest)
        now_us = to_us(now)
        return await self._write(
            lambda: agent_sessions.renew_credential(old_credential_id, new_digest, now, now_us)
        )

    # ------------------------------------------------------------ rate-limit token buckets

    async def take_tokens(self, buckets: Sequence[BucketTake], *, now: datetime) -> TokensRefused | None:
        wanted, now_us = tuple(buckets), to_us(now)
        if not wanted:
            return None
        if len({b.key for b in wanted}) != len(wanted):
            raise ValueError("each bucket may be named once per take")
        return await self._write(lambda: token_buckets.take_tokens(wanted, now_us))

    async def refund_tokens(self, buckets: Sequence[BucketTake], *, now: datetime) -> None:
        wanted, now_us = tuple(buckets), to_us(now)
        if wanted:
            await self._write(lambda: token_buckets.refund_tokens(wanted, now_us))

    async def prune_token_buckets(self, *, now: datetime) -> int:
        now_us = to_us(now)
        return await self._write(lambda: token_buckets.prune_token_buckets(now_us))
