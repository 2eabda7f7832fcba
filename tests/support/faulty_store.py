"""A store that fails on purpose, for tests of fail-closed paths (STYLE "Boundaries").

``FaultyStore(inner, fail_at="record_outcome", when="before_commit")`` wraps any
:class:`~bastion.store.base.Store` and raises :class:`~bastion.errors.NotDurable`
from one write operation:

- ``when="before_commit"``: the inner store is not called; the write did not happen.
- ``when="after_commit"``: the inner store commits the write, then the caller
  is told it failed (the honest shape of a lost acknowledgement).

It does so ``times`` times (``None``: until :meth:`FaultyStore.recover`), then
passes every call through. Reads always pass through. A chain write that carries
an execution transition (``step``) answers to that transition's fail point too
(``mark_invoking``, ``record_outcome``; ``reserve_execution`` when it reserves
first). Never use it outside tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, get_args

from bastion.admission.states import ExecutionState
from bastion.audit.entry import AuditEntry
from bastion.errors import NotDurable
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
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
    Store,
    StoreOwner,
    WorkerRecord,
)
from bastion.store.token_buckets import BucketTake, TokensRefused
from tests.support.approvals_passthrough import ApprovalStorePassthrough
from tests.support.pins_passthrough import PinStorePassthrough
from tests.support.replicas_passthrough import ReplicaRecordsPassthrough
from tests.support.tasks_passthrough import TaskStorePassthrough

__all__ = ["FailPoint", "FailWhen", "FaultyStore"]

T = TypeVar("T")

FailPoint = Literal[
    "register_worker",
    "claim_generation",
    "heartbeat",
    "withdraw_liveness",
    "mark_worker_failed",
    "record_attachment",
    "clear_attachment",
    "reserve_execution",
    "mark_invoking",
    "record_outcome",
    "release_execution",
    "recover_worker",
    "open_chain",
    "append_entry",
    "close_chain",
    "store_claim",
    "create_agent_session",
    "add_credential",
    "revoke_agent_session",
    "renew_credential",
]
FailWhen = Literal["before_commit", "after_commit"]


class FaultyStore(
    ReplicaRecordsPassthrough, TaskStorePassthrough, ApprovalStorePassthrough, PinStorePassthrough
):
    """Wraps ``inner`` and makes ``fail_at`` raise :class:`NotDurable` ``times`` times."""

    def __init__(
        self,
        inner: Store,
        *,
        fail_at: FailPoint = "record_outcome",
        when: FailWhen = "before_commit",
        times: int | None = 1,
    ) -> None:
        if fail_at not in get_args(FailPoint):
            raise ValueError(f"unknown fail point {fail_at!r}")
        if when not in get_args(FailWhen):
            raise ValueError(f"unknown failure timing {when!r}")
        if times is not None and times < 0:
            raise ValueError("times must be >= 0 or None")
        self.inner = inner
        self.fail_at = fail_at
        self.when = when
        self._remaining = times
        self.injected = 0

    @property
    def armed(self) -> bool:
        """Whether the next call to ``fail_at`` will fail."""
        return self._remaining is None or self._remaining > 0

    def recover(self) -> None:
        """Stop injecting failures: from now on every call passes through."""
        self._remaining = 0

    def fail_again(self, times: int | None = 1) -> None:
        """Arm the same fail point again for ``times`` more calls (``None``: until :meth:`recover`)."""
        self._remaining = times

    async def _guard(
        self, name: FailPoint, call: Callable[[], Awaitable[T]], *, also: tuple[FailPoint, ...] = ()
    ) -> T:
        if (name != self.fail_at and self.fail_at not in also) or not self.armed:
            return await call()
        if self._remaining is not None:
            self._remaining -= 1
        self.injected += 1
        if self.when == "after_commit":
            await call()
            raise NotDurable("injected failure after commit", fail_point=name)
        raise NotDurable("injected failure before commit", fail_point=name)

    async def aclose(self) -> None:
        await self.inner.aclose()

    # ------------------------------------------------------------ workers and fencing

    async def register_worker(
        self, worker_id: WorkerId, role: str, provenance: Mapping[str, Any], *, now: datetime
    ) -> WorkerRecord:
        return await self._guard(
            "register_worker", lambda: self.inner.register_worker(worker_id, role, provenance, now=now)
        )

    async def claim_generation(
        self, generation: str, worker_id: WorkerId, *, now: datetime, lease_s: float
    ) -> Epoch:
        return await self._guard(
            "claim_generation",
            lambda: self.inner.claim_generation(generation, worker_id, now=now, lease_s=lease_s),
        )

    async def heartbeat(self, worker_id: WorkerId, now: datetime) -> None:
        await self._guard("heartbeat", lambda: self.inner.heartbeat(worker_id, now))

    async def get_worker(self, worker_id: WorkerId) -> WorkerRecord | None:
        return await self.inner.get_worker(worker_id)

    async def get_generation(self, generation: str) -> GenerationRecord | None:
        return await self.inner.get_generation(generation)

    # ------------------------------------------------------------ ownership and health (reads pass)

    async def probe(self, timeout_s: float) -> None:
        await self.inner.probe(timeout_s)

    async def store_owners(self) -> list[StoreOwner]:
        return await self.inner.store_owners()

    async def add_store_owner(self, key_id: str, data_dir: str, *, now: datetime) -> None:
        await self.inner.add_store_owner(key_id, data_dir, now=now)

    # ------------------------------------------------------------ worker registry

    async def list_workers(self) -> list[WorkerRecord]:
        return await self.inner.list_workers()

    async def list_generations(self) -> list[GenerationRecord]:
        return await self.inner.list_generations()

    async def withdraw_liveness(self, worker_id: WorkerId, *, now: datetime, reason: str) -> WorkerRecord:
        return await self._guard(
            "withdraw_liveness", lambda: self.inner.withdraw_liveness(worker_id, now=now, reason=reason)
        )

    async def mark_worker_failed(self, worker_id: WorkerId, reason: str, now: datetime) -> WorkerRecord:
        return await self._guard(
            "mark_worker_failed", lambda: self.inner.mark_worker_failed(worker_id, reason, now)
        )

    async def generation_backlog(self, generation: str) -> GenerationBacklog:
        return await self.inner.generation_backlog(generation)

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
        return await self._guard(
            "record_attachment",
            lambda: self.inner.record_attachment(
                worker_id, transport_session_ref, namespace, now, writer=writer, epoch=epoch
            ),
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
        return await self._guard(
            "clear_attachment",
            lambda: self.inner.clear_attachment(
                worker_id, transport_session_ref, namespace, writer=writer, epoch=epoch
            ),
        )

    async def list_attachments(
        self, worker_id: WorkerId | None = None, *, transport_session_ref: str | None = None
    ) -> list[AttachmentRecord]:
        return await self.inner.list_attachments(worker_id, transport_session_ref=transport_session_ref)

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
        return await self._guard(
            "reserve_execution",
            lambda: self.inner.reserve_execution(
                agent, execution_id, binding, call_id=call_id, worker=worker, epoch=epoch
            ),
        )

    async def mark_invoking(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        return await self._guard(
            "mark_invoking", lambda: self.inner.mark_invoking(agent, execution_id, worker=worker, epoch=epoch)
        )

    async def record_outcome(
        self,
        agent: AgentId,
        execution_id: ExecutionId,
        outcome: ExecutionState,
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> ExecutionRecord:
        return await self._guard(
            "record_outcome",
            lambda: self.inner.record_outcome(agent, execution_id, outcome, worker=worker, epoch=epoch),
        )

    async def release_execution(
        self, agent: AgentId, execution_id: ExecutionId, *, worker: WorkerId, epoch: Epoch
    ) -> ExecutionRecord:
        return await self._guard(
            "release_execution",
            lambda: self.inner.release_execution(agent, execution_id, worker=worker, epoch=epoch),
        )

    async def get_execution(self, agent: AgentId, execution_id: ExecutionId) -> ExecutionRecord | None:
        return await self.inner.get_execution(agent, execution_id)

    async def recover_worker(
        self, dead_worker_generation: str, *, new_worker: WorkerId, new_epoch: Epoch
    ) -> list[RecoveredExecution]:
        return await self._guard(
            "recover_worker",
            lambda: self.inner.recover_worker(
                dead_worker_generation, new_worker=new_worker, new_epoch=new_epoch
            ),
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
        return await self._guard(
            "open_chain",
            lambda: self.inner.open_chain(
                session_id,
                genesis,
                worker=worker,
                epoch=epoch,
                then=then,
                closed_with_claim=closed_with_claim,
                step=step,
            ),
            also=_step_points(step),
        )

    async def append_entry(
        self, session_id: EvidenceSessionId, build: AppendBuilder, *, worker: WorkerId, epoch: Epoch
    ) -> AuditEntry:
        return await self._guard(
            "append_entry", lambda: self.inner.append_entry(session_id, build, worker=worker, epoch=epoch)
        )

    async def append_entries(
        self,
        session_id: EvidenceSessionId,
        builds: Sequence[AppendBuilder],
        *,
        worker: WorkerId,
        epoch: Epoch,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        # The same fail point as append_entry: both are "an audit append". With a step, the
        # transition's own fail point too: the write is both.
        return await self._guard(
            "append_entry",
            lambda: self.inner.append_entries(session_id, builds, worker=worker, epoch=epoch, step=step),
            also=_step_points(step),
        )

    async def read_chain(
        self, session_id: EvidenceSessionId, *, start_seq: int = 0, limit: int | None = None
    ) -> list[AuditEntry]:
        return await self.inner.read_chain(session_id, start_seq=start_seq, limit=limit)

    async def get_chain(self, session_id: EvidenceSessionId) -> ChainInfo | None:
        return await self.inner.get_chain(session_id)

    async def find_entries(
        self, execution_id: ExecutionId, *, agent: AgentId | None = None, limit: int = 10_000
    ) -> list[AuditEntry]:
        return await self.inner.find_entries(execution_id, agent=agent, limit=limit)

    async def list_open_chains(self, *, generation: str | None = None) -> list[ChainInfo]:
        return await self.inner.list_open_chains(generation=generation)

    async def close_chain(
        self,
        session_id: EvidenceSessionId,
        *,
        worker: WorkerId,
        epoch: Epoch,
        final: AppendBuilder | None = None,
        claim_for: Callable[[AuditEntry], Mapping[str, Any]] | None = None,
    ) -> ChainInfo:
        return await self._guard(
            "close_chain",
            lambda: self.inner.close_chain(
                session_id, worker=worker, epoch=epoch, final=final, claim_for=claim_for
            ),
        )

    async def store_claim(
        self,
        session_id: EvidenceSessionId,
        claim: Mapping[str, Any],
        *,
        worker: WorkerId,
        epoch: Epoch,
    ) -> None:
        await self._guard(
            "store_claim", lambda: self.inner.store_claim(session_id, claim, worker=worker, epoch=epoch)
        )

    async def get_claim(self, session_id: EvidenceSessionId) -> dict[str, Any] | None:
        return await self.inner.get_claim(session_id)

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
        return await self._guard(
            "create_agent_session",
            lambda: self.inner.create_agent_session(
                human=human, agent=agent, team=team, scopes=scopes, now=now, expires_at=expires_at
            ),
        )

    async def add_credential(
        self, agent_session_id: str, kind: CredentialKind, digest: str, *, now: datetime
    ) -> CredentialRecord:
        return await self._guard(
            "add_credential", lambda: self.inner.add_credential(agent_session_id, kind, digest, now=now)
        )

    async def find_credential(
        self, kind: CredentialKind, digest: str
    ) -> tuple[CredentialRecord, AgentSessionRecord] | None:
        return await self.inner.find_credential(kind, digest)

    async def get_agent_session(self, agent_session_id: str) -> AgentSessionRecord | None:
        return await self.inner.get_agent_session(agent_session_id)

    async def list_agent_sessions(self, *, agent: AgentId | None = None) -> list[AgentSessionRecord]:
        return await self.inner.list_agent_sessions(agent=agent)

    async def list_credentials(self, agent_session_id: str) -> list[CredentialRecord]:
        return await self.inner.list_credentials(agent_session_id)

    async def revoke_agent_session(
        self, agent_session_id: str, *, by: str, reason: str, now: datetime
    ) -> AgentSessionRecord:
        return await self._guard(
            "revoke_agent_session",
            lambda: self.inner.revoke_agent_session(agent_session_id, by=by, reason=reason, now=now),
        )

    async def renew_credential(
        self, old_credential_id: str, new_digest: str, *, now: datetime
    ) -> CredentialRecord:
        return await self._guard(
            "renew_credential", lambda: self.inner.renew_credential(old_credential_id, new_digest, now=now)
        )

    # ------------------------------------------------------------ rate-limit token buckets (pass through)

    async def take_tokens(self, buckets: Sequence[BucketTake], *, now: datetime) -> TokensRefused | None:
        return await self.inner.take_tokens(buckets, now=now)

    async def refund_tokens(self, buckets: Sequence[BucketTake], *, now: datetime) -> None:
        await self.inner.refund_tokens(buckets, now=now)

    async def prune_token_buckets(self, *, now: datetime) -> int:
        return await self.inner.prune_token_buckets(now=now)


def _conforms(store: FaultyStore) -> Store:
    """Let mypy check that the wrapper implements the whole contract."""
    return store


def _step_points(step: ExecutionStep | None) -> tuple[FailPoint, ...]:
    """The fail points of the execution transition a chain write carries, if any."""
    if step is None:
        return ()
    if step.target is ExecutionState.INVOKING:
        return ("reserve_execution", "mark_invoking") if step.reserve_binding else ("mark_invoking",)
    return ("record_outcome",)
