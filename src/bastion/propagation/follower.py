"""Apply what other replicas did, and tell them what only they can act on (DESIGN sections 1, 5, 7; #10).

One :class:`ReplicaFollower` per gateway. It applies each change of the feed:

- ``agent_session_revoked``: if this replica serves that agent session (a
  transport session, or a sessionless request in flight), end it here: the
  same audited operation as a revocation made here.
- ``transport_session_terminated``: close this replica's share of the
  session (its in-flight calls cancelled, its upstream sessions and its
  evidence session closed) with the reason the terminating replica gave.
- ``request_cancelled`` / ``client_replied``: a session-era client's
  ``notifications/cancelled``, or its answer to a server-to-client request,
  reached a replica that does not hold the request. That replica publishes
  it (``session/shared.py``: ``forward_cancel``, ``forward_reply``); the one
  holding it applies it here. Both name the transport session by its store key and reach
  only that session's own tables, so isolation (DESIGN section 5) holds
  across replicas as it does within one.
- ``approval_decided`` (issue 27): an approval request was decided at some
  replica: wake the call waiting on it here, if any (``approvals/waiters.py``).
- ``pins_changed``: an operator decided a changed definition (issue 27):
  read that server's pins again and list it again, so the approved
  definition is served (or the rejected one stays withheld) here too.
- ``policy_reloaded``: another replica reloaded its configuration: reload
  ours, so the fleet converges; a replica whose file differs shows as behind
  (``propagation/policy_status.py``), and :meth:`ReplicaFollower.snapshot_lag_s`
  says for how long (``/metrics``: a replica that never follows records no
  follow lag, so the lag it is accruing is read at scrape).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bastion.errors import ConfigError
from bastion.ids import WorkerId
from bastion.session.registry import SessionRegistry
from bastion.session.state import TransportSession
from bastion.store.commit_stats import CountHistogram
from bastion.store.replicas import Change, ChangeKind, ReplicaRecords

__all__ = ["LAG_BUCKETS", "ReplicaFollower"]

#: Seconds from a change at another replica to its effect here (DESIGN section 7: under one).
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

logger = logging.getLogger(__name__)


class ReplicaFollower:
    """Applies the change feed to this gateway, and publishes what another replica must apply."""

    def __init__(
        self,
        store: ReplicaRecords,
        registry: SessionRegistry,
        *,
        worker: Callable[[], WorkerId | None],
        revoked: Callable[[str], Awaitable[None]],
        close_locally: Callable[[TransportSession, str], Awaitable[None]],
        reload_policy: Callable[[], Awaitable[Any]],
        policy_version: Callable[[], str],
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        approval_decided: Callable[[str], None] | None = None,
        pins_changed: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._approval_decided = approval_decided
        self._pins_changed = pins_changed
        self._store = store
        self._registry = registry
        self._worker = worker
        self._revoked = revoked
        self._close_locally = close_locally
        self._reload_policy = reload_policy
        self._policy_version = policy_version
        self._now = now
        #: Seconds from a revocation (its ``revoked_at``, published by the store at any replica,
        #: this one included) to this replica having applied it, and from a policy reload at
        #: another replica to this one following it (``metrics.py``): the lags DESIGN section 7
        #: bounds.
        self.revocation_lag = CountHistogram(LAG_BUCKETS)
        self.policy_lag = CountHistogram(LAG_BUCKETS)
        # The oldest peer reload this replica has not followed (its version and time), if any.
        self._unfollowed: tuple[str, datetime] | None = None

    def snapshot_lag_s(self) -> float:
        """Seconds this replica's snapshot has been behind a peer's reload it could not follow
        (0 when it runs what its peers last announced, or has since reloaded to it)."""
        unfollowed = self._unfollowed
        if unfollowed is None:
            return 0.0
        if unfollowed[0] == self._policy_version():
            self._unfollowed = None
            return 0.0
        return max(0.0, (self._now() - unfollowed[1]).total_seconds())

    def _lag(self, histogram: CountHistogram, change: Change) -> None:
        histogram.observe(max(0.0, (self._now() - change.at).total_seconds()))

    async def apply(self, change: Change) -> None:
        own = change.origin is not None and change.origin == self._worker()
        if change.kind is ChangeKind.AGENT_SESSION_REVOKED:
            await self._revoked(change.subject)
            self._lag(self.revocation_lag, change)
        elif change.kind is ChangeKind.TRANSPORT_SESSION_TERMINATED:
            transport_session = self._registry.by_key(change.subject)
            if transport_session is not None:
                reason = (change.detail or {}).get("reason", "client_delete")
                await self._close_locally(transport_session, str(reason))
        elif change.kind is ChangeKind.APPROVAL_DECIDED and self._approval_decided is not None:
            self._approval_decided(change.subject)  # a call waiting here reads the decision
        elif change.kind is ChangeKind.PINS_CHANGED and self._pins_changed is not None:
            await self._pins_changed(change.subject)  # a decision made anywhere, here included
        elif change.kind is ChangeKind.REQUEST_CANCELLED and not own:
            self._apply_cancel(change)
        elif change.kind is ChangeKind.CLIENT_REPLIED and not own:
            self._apply_reply(change)
        elif (
            change.kind is ChangeKind.POLICY_RELOADED and not own and change.subject != self._policy_version()
        ):
            try:
                await self._reload_policy()
            except ConfigError as exc:
                self._behind_since(change)
                logger.error(
                    "policy reload at a peer not followed here; the last valid snapshot stays",
                    extra={"error": exc.message, "peer_version": change.subject},
                )
                return
            self._lag(self.policy_lag, change)
            if change.subject == self._policy_version():
                self._unfollowed = None
            else:  # reloaded, to another version: this replica's file differs from the peer's
                self._behind_since(change)

    def _behind_since(self, change: Change) -> None:
        if self._unfollowed is None:  # the oldest reload not followed: behind since then
            self._unfollowed = (change.subject, change.at)

    def _apply_cancel(self, change: Change) -> None:
        transport_session = self._registry.by_key(change.subject)
        request_id = (change.detail or {}).get("request_id")
        if transport_session is None or not isinstance(request_id, str | int):
            return
        call = transport_session.in_flight.get(request_id)
        if call is not None and call.method != "initialize":
            call.cancel_scope.cancel()

    def _apply_reply(self, change: Change) -> None:
        transport_session = self._registry.by_key(change.subject)
        detail = change.detail or {}
        relay_id, reply = detail.get("relay_id"), detail.get("reply")
        if transport_session is None or not isinstance(relay_id, str) or not isinstance(reply, dict):
            return
        pending = transport_session.client_requests.get(relay_id)
        if pending is not None and not pending.done.is_set():
            pending.reply = reply
            pending.done.set()
