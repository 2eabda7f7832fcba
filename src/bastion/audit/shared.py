"""The evidence sessions that sessionless requests join (DESIGN sections 1 and 4).

A sessionless request has no transport session to scope its evidence, and a
chain of its own per request (genesis, attestation, close, a signed claim)
costs more than the call. So the sessionless requests of one agent session
(or of one agent, when its credential names none) at this gateway append to
one shared chain, held here in one :class:`EvidenceScope` per key:

* **keyed per gateway**: each :class:`Gateway` holds its own
  :class:`SharedEvidence`; two gateways in one process, or two replicas on one
  PostgreSQL store, never share a chain (each chain is written under its
  worker's epoch, and its id is random);
* **agents never share a chain**: the key is ``(agent, agent_session_id)``;
* **concurrent requests** of one key append to the one chain; the store links
  each append to the head it reads in its transaction (no fork, no gap), and
  each answer waits for its own entries to be durable (``recorder.py``);
* **bounded and prompt**: the chain rotates at its entry bound (``recorder.py``),
  and at its age bound (``--sessionless-evidence-max-age-s``, 60 s) the key
  gets a fresh scope for the requests that come next, while the requests that
  joined the old one finish in it: nobody waits for a slow call to rotate,
  and one call's entries stay in one chain. A sweep
  (:meth:`SharedEvidence.sweep_forever`, every quarter of the bound, at most
  5 s) closes, claim issued, each old scope once its requests have ended and
  any chain past its age even when no request comes, and forgets keys nobody
  uses, so a finished request leaves no per-client state behind for longer
  than the bound;
* **revocation** closes the agent session's chain (:meth:`close_agent_session`),
  **shutdown** closes every chain (:meth:`close_all`), each with its claim;
  a chain left open by a crash is closed with a claim by whoever recovers
  the worker's generation (``workers/recovery.py``), as a session-era one.

A receipt names the chain, ``seq`` and hash of the call's last entry; its
claim is at ``GET /sessions/{evidence_session_id}/trace-claim`` once the chain
has closed (before that: 404 ``claim_not_issued`` with ``Retry-After``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from bastion.audit.chain import CloseReason
from bastion.audit.recorder import EvidenceRecorder
from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.errors import StoreError

__all__ = ["SharedEvidence"]

logger = logging.getLogger(__name__)

#: How long a shutdown or a revocation waits for calls holding slots in a chain before closing it.
_QUIET_WAIT_S = 10.0
_MAX_SWEEP_INTERVAL_S = 5.0

_Key = tuple[str, str | None]


@dataclass(eq=False)
class _Shared:
    scope: EvidenceScope
    agent_session_id: str | None
    users: int = 0
    # Set when the last request leaves; made only while someone waits for that (a revocation),
    # not per request: at concurrency 1 every request would make one and set it (issue 28).
    unused: anyio.Event | None = None


class SharedEvidence:
    """The shared evidence scopes of one gateway's sessionless requests, by agent session."""

    def __init__(
        self,
        recorder: EvidenceRecorder,
        *,
        max_age_s: float,
        policy_version: Callable[[], str | None],
        unsafe_disabled: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recorder = recorder
        self._max_age_s = max_age_s
        self._policy_version = policy_version
        self._unsafe_disabled = unsafe_disabled
        self._monotonic = monotonic
        self._scopes: dict[_Key, _Shared] = {}
        # Scopes past their age that requests still use; closed once those requests end.
        self._draining: list[_Shared] = []
        self._by_scope: dict[EvidenceScope, _Shared] = {}

    def __len__(self) -> int:
        return len(self._scopes) + len(self._draining)

    def join(self, principal: Principal) -> EvidenceScope:
        """The shared scope of this principal's key; :meth:`leave` it when the request ends."""
        key = (str(principal.agent), principal.agent_session_id)
        shared = self._scopes.get(key)
        if shared is not None and self._aged(shared):
            # Past its age: the next requests start a new chain; this one closes when its own end.
            del self._scopes[key]
            self._draining.append(shared)
            shared = None
        if shared is None:
            scope = EvidenceScope(
                self._recorder,
                principal.agent,
                policy_version=self._policy_version(),
                unsafe_disabled=self._unsafe_disabled,
            )
            shared = self._scopes[key] = self._by_scope[scope] = _Shared(scope, principal.agent_session_id)
        shared.users += 1
        return shared.scope

    def leave(self, scope: EvidenceScope) -> None:
        """A request that joined ``scope`` ended (its entries are durable already)."""
        shared = self._by_scope.get(scope)
        if shared is not None:
            shared.users -= 1
            if shared.users == 0 and shared.unused is not None:
                shared.unused.set()
                shared.unused = None

    def _aged(self, shared: _Shared) -> bool:
        evidence = shared.scope.evidence
        return (
            evidence is not None
            and not evidence.closed
            and not evidence.dormant
            and self._monotonic() - evidence.opened_at >= self._max_age_s
        )

    async def sweep(self) -> list[str]:
        """Close, with their claims, old scopes whose requests ended and chains past their age.

        Returns the ids of the chains closed. A chain that cannot be closed now (the store
        failed) is tried again at the next sweep, or closed by recovery.
        """
        closed: list[str] = []
        for shared in list(self._draining):
            # Closed once no call holds slots in it (a listen stream may keep its request open).
            closed += await self._retire(shared, CloseReason.ROTATION, wait_s=None)
            if shared.users == 0 and _idle(shared):
                self._draining.remove(shared)
                self._forget(shared)
        for key, shared in list(self._scopes.items()):
            if self._aged(shared):
                closed += await self._retire(shared, CloseReason.ROTATION, wait_s=None)
            if shared.users == 0 and _idle(shared) and self._scopes.get(key) is shared:
                # Nobody uses it and no chain is open behind it: nothing of this client stays here.
                del self._scopes[key]
                self._forget(shared)
        return closed

    async def sweep_forever(self) -> None:
        """The age bound holds with no traffic: sweep every quarter of it (at most every 5 s)."""
        interval = min(max(self._max_age_s / 4, 0.01), _MAX_SWEEP_INTERVAL_S)
        while True:
            await anyio.sleep(interval)
            await self.sweep()

    def agent_sessions(self) -> set[str]:
        """The agent sessions with a shared scope here (a revocation elsewhere must reach them)."""
        every = [*self._scopes.values(), *self._draining]
        return {shared.agent_session_id for shared in every if shared.agent_session_id}

    async def close_agent_session(self, agent_session_id: str) -> list[str]:
        """Revocation: close that agent session's chains with their claims; returns their ids.

        Its requests were cancelled: the chains close once those requests have recorded their
        outcome and ended (bounded), so no entry of theirs is left in a chain nobody closes.
        """
        mine = [
            s for s in (*self._scopes.values(), *self._draining) if s.agent_session_id == agent_session_id
        ]
        with anyio.move_on_after(_QUIET_WAIT_S):
            for shared in mine:
                if shared.users:
                    if shared.unused is None:
                        shared.unused = anyio.Event()
                    await shared.unused.wait()
        closed: list[str] = []
        for shared in mine:
            closed += await self._retire(shared, CloseReason.REVOCATION, wait_s=_QUIET_WAIT_S)
        return closed

    async def close_all(self) -> list[str]:
        """Shutdown: close every chain with its claim; returns their ids."""
        closed: list[str] = []
        for shared in [*self._draining, *self._scopes.values()]:
            closed += await self._retire(shared, CloseReason.SHUTDOWN, wait_s=_QUIET_WAIT_S)
        return closed

    async def _retire(self, shared: _Shared, reason: CloseReason, *, wait_s: float | None) -> list[str]:
        evidence = shared.scope.evidence
        if evidence is None:
            return []
        try:
            session_id = await self._recorder.retire(evidence, reason, wait_s=wait_s)
        except StoreError as exc:
            logger.warning("shared evidence session not closed yet: %s", exc.message)
            return []
        return [] if session_id is None else [session_id]

    def _forget(self, shared: _Shared) -> None:
        # Closed, so an entry still owed to it (storage failed) gets a chain of its own.
        del self._by_scope[shared.scope]
        shared.scope.closed = True


def _idle(shared: _Shared) -> bool:
    """No chain is open behind the scope."""
    evidence = shared.scope.evidence
    return evidence is None or evidence.dormant or evidence.closed
