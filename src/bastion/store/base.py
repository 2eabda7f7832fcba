"""The store contract every engine implements (DESIGN sections 3, 4, 6 and 7).

This module owns the :class:`Store` protocol; with its parts (below) it states
what each operation makes atomic and what it raises; the engines
(``sqlite.py`` now, ``postgres.py`` later) follow it, and the contract tests in
``tests/contract/store/`` run the same cases against each. Nothing here may
name an engine: no SQL, no file paths, no driver types.

The contract is drawn in parts, each beside its records (issue 26): ``workers.py``
(workers, generations, attachment records), ``executions.py``, ``chains.py`` (audit
chains and claims), ``agent_sessions.py``, ``replicas.py``, ``token_buckets.py`` and
``tasks.py``. :class:`Store` is all of them, and the records are re-exported here.

Fencing model (DESIGN section 6)
--------------------------------
A *worker* is one running gateway replica or upstream runtime. It registers
once under an identity that is never replaced. A *generation* is the slot a
worker claims (``"gateway-0"``, say); claiming it returns the *epoch*, which
rises by one on every takeover. A worker is bound to one generation for its
life, and the store remembers which, so a write names its generation through
its worker: every write that matters takes ``(worker, epoch)``, and the engine
checks, in the same transaction as the write, that ``worker`` is the current
holder of its generation at exactly ``epoch``. Anything else raises :class:`StaleEpoch`
and writes nothing. There is no unfenced mode: a gateway registers a worker
and claims a generation before it writes (a survivor that recovers a dead
replica registers a fresh recovery worker and claims the dead generation).

An execution row belongs to the generation that reserved it: only a worker of
that generation moves it on (anything else raises :class:`Conflict`), and
:meth:`Store.recover_worker` is how a generation's new holder settles what
its dead predecessor left.

Durability and errors
---------------------
Every write returns only once it is durable. A write that cannot be made
durable raises :class:`NotDurable`; the caller cannot know whether it landed
(a lost acknowledgement looks the same), so it must neither repeat an effect
nor report success: the row stays non-terminal as far as it knows, and hence
refused (seed 000). Domain refusals
(collision, in flight, replay) are raised as the ``CallRefused`` errors from
``errors.py``; storage refusals as :class:`StoreError` subclasses. A caller
cancelled while its write is being committed may not learn its result: treat
that like :class:`NotDurable` after commit (the write may have happened).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bastion.store.agent_sessions import (
    AgentSessionRecord,
    AgentSessionStore,
    CredentialKind,
    CredentialRecord,
)
from bastion.store.approvals import ApprovalStore
from bastion.store.chains import AppendBuilder, ChainInfo, ChainStore
from bastion.store.executions import (
    ExecutionRecord,
    ExecutionStep,
    ExecutionStore,
    Readmitted,
    RecoveredExecution,
    Reserved,
    ReserveOutcome,
)
from bastion.store.pins import PinStore
from bastion.store.replicas import ReplicaRecords
from bastion.store.tasks import TaskStore
from bastion.store.token_buckets import TokenBucketStore
from bastion.store.workers import (
    AttachmentRecord,
    GenerationBacklog,
    GenerationRecord,
    WorkerRecord,
    WorkerStore,
)

__all__ = [
    "AgentSessionRecord",
    "AppendBuilder",
    "AttachmentRecord",
    "ChainInfo",
    "CredentialKind",
    "CredentialRecord",
    "ExecutionRecord",
    "ExecutionStep",
    "GenerationBacklog",
    "GenerationRecord",
    "Readmitted",
    "RecoveredExecution",
    "ReserveOutcome",
    "Reserved",
    "Store",
    "WorkerRecord",
]


@dataclass(frozen=True, slots=True)
class StoreOwner:
    """A signing key that this store belongs to, and the data directory it was in (issue #23)."""

    key_id: str
    data_dir: str
    joined: datetime


class Store(
    WorkerStore,
    ExecutionStore,
    ChainStore,
    AgentSessionStore,
    ReplicaRecords,
    TokenBucketStore,
    TaskStore,
    ApprovalStore,
    PinStore,
    Protocol,
):
    """The one storage contract. Every method is a coroutine; times are timezone-aware.

    Each write below is one atomic transaction. Engines may commit several
    concurrent writes in one transaction (group commit), but each keeps its own
    atomicity and its own result or error.
    """

    async def aclose(self) -> None:
        """Finish writes in progress and release every connection. Later calls raise :class:`StoreError`."""
        ...

    # ------------------------------------------------------------ ownership and health (issue #23)

    async def probe(self, timeout_s: float) -> None:
        """One cheap read that proves the store answers now.

        Raises :class:`StoreError` (with its ``cause`` when one is known) when it
        does not answer, or not within ``timeout_s``.
        """
        ...

    async def store_owners(self) -> list[StoreOwner]:
        """The signing keys this store belongs to, the first one first (``store/ownership.py``)."""
        ...

    async def add_store_owner(self, key_id: str, data_dir: str, *, now: datetime) -> None:
        """Record that the key ``key_id`` (of ``data_dir``) uses this store; a known key is left as it is."""
        ...
