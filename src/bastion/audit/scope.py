"""The evidence scope of one client context: a transport session, or the sessionless requests of one
agent session at this gateway (``shared.py``).

Opens its evidence session on the first entry (idle transport sessions cost
no writes) and closes it, with its claim, when the scope ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import anyio

from bastion.audit.chain import CloseReason
from bastion.audit.entry import AuditEntry, AuditEvent, format_ts
from bastion.audit.recorder import EVENT_AT, EvidenceRecorder, EvidenceSession
from bastion.ids import AgentId
from bastion.store.base import ExecutionStep

__all__ = ["EvidenceScope", "Owed"]

# A deferred write of owed entries; given a step, the execution transition owed with them.
Owed = Callable[..., Awaitable[list[AuditEntry]]]


class EvidenceScope:
    def __init__(
        self,
        recorder: EvidenceRecorder,
        agent: AgentId,
        *,
        policy_version: str | None,
        unsafe_disabled: bool = False,
    ) -> None:
        self._recorder = recorder
        # Benchmarks only (``bastion serve --unsafe-no-audit``): nothing is recorded.
        self._unsafe_disabled = unsafe_disabled
        self.agent = agent
        self._policy_version = policy_version
        self._evidence: EvidenceSession | None = None
        self._opening = anyio.Lock(fast_acquire=True)  # uncontended: no loop turn per call
        self.closed = False

    @property
    def evidence(self) -> EvidenceSession | None:
        """The live chain behind this scope, once its first entry opened it."""
        return self._evidence

    @property
    def session_id(self) -> str | None:
        return None if self._evidence is None else self._evidence.session_id

    def now(self) -> datetime:
        """The wall clock this scope's entries are stamped with: an event's time, for an entry
        queued before its write (``recorder.EVENT_AT``)."""
        return self._recorder.now()

    async def record(self, event: AuditEvent, **fields: Any) -> AuditEntry | None:
        """Append one entry to this scope's chain, opening it first if needed."""
        if self._unsafe_disabled:
            return None
        async with self._opening:
            if self._evidence is None:
                self._evidence = await self._recorder.open(self.agent, policy_version=self._policy_version)
        return await self._recorder.append(self._evidence, event, **fields)

    async def record_many(
        self,
        batch: list[tuple[AuditEvent, dict[str, Any]]],
        *,
        durable: bool = True,
        then: int = 0,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        """Append several entries in order, as one durable write, before returning.

        ``durable`` is kept for callers (``call.py``) and changes nothing: every scope writes
        now (one request's own in-memory chain is gone; see ``shared.py``). ``then``:
        how many more entries the batch's call may write; they stay in this chain
        (``recorder.py``) until written or :meth:`end_call`. ``step``: an execution transition
        written in the same transaction as the entries (always now, whatever ``durable`` says).
        """
        if self._unsafe_disabled and step is not None:
            await self._recorder.step_alone(step)
        if self._unsafe_disabled or not (batch or step):
            return []
        async with self._opening:
            if self._evidence is None:
                self._evidence = await self._recorder.open(self.agent, policy_version=self._policy_version)
        return await self._recorder.append_many(self._evidence, batch, then=then, step=step)

    def end_call(self, call_id: str) -> None:
        """The call has written everything it will: the chain slots it held are free."""
        if self._evidence is not None:
            self._recorder.end_call(self._evidence, call_id)

    def owe(self, batch: list[tuple[AuditEvent, dict[str, Any]]]) -> Owed:
        """The deferred write of entries owed since storage failed (``store/health.py``), stamped now.

        Written later, each entry's ``ts`` is its write time (the chain's order) and its
        ``detail`` says ``late: true`` and ``event_ts``, the time the event was owed
        (issue #11 point 12): the entry field set, hence the hash rule, is unchanged.
        """
        event_ts = format_ts(self._recorder.now())

        async def write(step: ExecutionStep | None = None) -> list[AuditEntry]:
            return await self.record_owed_many(batch, event_ts=event_ts, step=step)

        return write

    async def record_owed_many(
        self,
        batch: list[tuple[AuditEvent, dict[str, Any]]],
        *,
        event_ts: str | None = None,
        step: ExecutionStep | None = None,
    ) -> list[AuditEntry]:
        """Write entries owed since storage failed: into this chain if it is still open, else into
        a chain of their own (the original evidence session has closed meanwhile). Each is marked
        ``detail.late`` (with ``detail.event_ts`` when known). ``step``: the execution transition
        owed with them (a terminal write that failed, issue #23), in the same transaction."""
        if self._unsafe_disabled:
            if step is not None:
                await self._recorder.step_alone(step)
            return []
        stamp: dict[str, Any] = {"late": True} if event_ts is None else {"late": True, "event_ts": event_ts}
        # Written late, an entry's ts is its write time (the chain's order): its event time, if it
        # carried one, is not kept as ts (``detail.event_ts`` says when it was owed).
        marked = [
            (
                event,
                {
                    **{k: v for k, v in fields.items() if k != EVENT_AT},
                    "detail": {**(fields.get("detail") or {}), **stamp},
                },
            )
            for event, fields in batch
        ]
        if not self.closed and (self._evidence is None or not self._evidence.closed):
            return await self.record_many(marked, step=step)
        late = EvidenceScope(self._recorder, self.agent, policy_version=self._policy_version)
        entries = await late.record_many(marked, step=step)
        await late.close(CloseReason.REQUEST_END)
        return entries

    async def close(self, reason: CloseReason) -> dict[str, Any] | None:
        """Close the chain (if one was opened) and return its claim."""
        self.closed = True
        if self._evidence is None:
            return None
        return await self._recorder.close(self._evidence, reason)
