"""Front transport sessions shared by every replica through the store (DESIGN sections 1, 5 and 7; #10).

Owns the store side of a session-era transport session's life:

- **Opened:** the record (owner, negotiated version, client capabilities and
  info) is durable before the client learns the ``Mcp-Session-Id``.
- **Loaded on a miss:** a replica that does not hold an id in memory reads
  its record, answers exactly as for an unknown id when it is unknown,
  terminated, idle past the timeout or another principal's (the cause is kept
  for the audit), and otherwise holds it like one of its own. Upstream
  sessions and the evidence session of that replica's share are opened
  lazily, as for a fresh session. The hot path is untouched: a held session is
  served from memory, and the store is read only on a miss.
- **Touched in batches:** requests mark sessions used; :meth:`flush_touches`
  moves their shared ``last_seen_at`` on in one write, so idle expiry is
  decided on what every replica saw.
- **Forwarded:** a ``notifications/cancelled`` or a client's answer to a
  server-to-client request that reaches a replica not holding the request is
  published on the change feed for the replica that holds it.
- **Ended everywhere:** DELETE, shared idle expiry and revocation write the
  termination once; other replicas learn it from the change feed
  (``replicas/follower.py``).

Per-session isolation (DESIGN section 5) is unchanged: a loaded session is a
fresh :class:`TransportSession` record of its own; nothing of another
session's state is read or shared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.errors import SessionNotFound, SessionStoreUnavailable, StoreError
from bastion.ids import AgentId, Epoch, TransportSessionId, WorkerId
from bastion.session.registry import SessionRegistry
from bastion.session.state import TransportSession
from bastion.store.base import Store
from bastion.store.replicas import ChangeKind, TransportSessionRecord, transport_session_key

__all__ = ["SharedSessions"]

logger = logging.getLogger(__name__)


class SharedSessions:
    """This replica's bridge between its in-memory :class:`SessionRegistry` and the stored records."""

    def __init__(
        self,
        registry: SessionRegistry,
        store: Store,
        credentials: Callable[[], tuple[WorkerId, Epoch]],
        evidence_for: Callable[[AgentId], EvidenceScope],
        *,
        idle_timeout_s: Callable[[], float],
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._registry = registry
        self._store = store
        self._credentials = credentials
        self._evidence_for = evidence_for
        self._idle_timeout_s = idle_timeout_s
        self._wall_clock = wall_clock

    async def record_opened(self, transport_session: TransportSession) -> None:
        """Make the new session's record durable; on failure forget the session and raise.

        Raises:
            SessionStoreUnavailable: the record could not be written (the client gets no id).
        """
        principal = transport_session.principal
        now = self._wall_clock()
        writer, epoch = self._credentials()
        record = TransportSessionRecord(
            key=transport_session_key(transport_session.id),
            agent=transport_session.agent,
            agent_session_id=principal.agent_session_id,
            credential_id=principal.credential_id,
            protocol_version=transport_session.protocol_version,
            client_capabilities=transport_session.client_capabilities,
            client_info=transport_session.client_info,
            created_at=now,
            last_seen_at=now,
            created_by=writer,
        )
        try:
            await self._store.create_transport_session(record, writer=writer, epoch=epoch)
        except StoreError as exc:
            self._registry.remove(transport_session)
            raise SessionStoreUnavailable() from exc

    async def load(self, session_id: str, principal: Principal) -> TransportSession:
        """The session ``session_id`` from the store, held here from now on.

        Raises:
            SessionNotFound: unknown, terminated, idle past the timeout, or another principal's
                (``exc.cause`` says which; the wire answer is the same).
            SessionStoreUnavailable: the store could not be read.
        """
        try:
            record = await self._store.get_transport_session(transport_session_key(session_id))
        except StoreError as exc:
            raise SessionStoreUnavailable() from exc
        # (1) exists, (2) not terminated, (3) same principal, (4) not idle past the timeout
        if record is None:
            raise SessionNotFound(cause="unknown")
        if record.terminated_at is not None:
            raise SessionNotFound(cause="terminated")
        if record.agent != principal.agent or record.credential_id != principal.credential_id:
            raise SessionNotFound(cause="foreign")
        if self._wall_clock() - record.last_seen_at > timedelta(seconds=self._idle_timeout_s()):
            raise SessionNotFound(cause="expired")
        transport_session = self._registry.new_session(
            TransportSessionId(session_id),
            principal,
            record.protocol_version,
            record.client_capabilities,
            record.client_info,
            self._evidence_for(principal.agent),
        )
        # Two requests may have loaded it at once: the first one held wins, the other is dropped unused.
        return self._registry.adopt(transport_session)

    async def flush_touches(self) -> None:
        """Write the shared ``last_seen_at`` of every session used here since the last flush."""
        touched = self._registry.take_touched()
        if not touched:
            return
        writer, epoch = self._credentials()
        keys = [transport_session_key(session_id) for session_id in touched]
        try:
            await self._store.touch_transport_sessions(keys, self._wall_clock(), writer=writer, epoch=epoch)
        except StoreError as exc:
            # Not fatal: the sessions look idle sooner elsewhere, never later (fail closed).
            logger.warning("transport session expiry not moved on: %s", exc.message)

    async def idle_everywhere(self, transport_session: TransportSession) -> bool:
        """Whether the store, too, saw no use of this session within the idle timeout (or has no record).

        ``False`` when the store cannot be read: this replica then forgets its share only, and the
        session expires everywhere once a replica can see that nobody used it.
        """
        try:
            record = await self._store.get_transport_session(transport_session_key(transport_session.id))
        except StoreError:
            return False
        if record is None or record.terminated_at is not None:
            return True
        return self._wall_clock() - record.last_seen_at > timedelta(seconds=self._idle_timeout_s())

    async def forward_cancel(self, transport_session: TransportSession, request_id: str | int) -> None:
        """This replica does not hold ``request_id``: let the replica that does cancel it."""
        await self._publish(ChangeKind.REQUEST_CANCELLED, transport_session, {"request_id": request_id})

    async def forward_reply(
        self, transport_session: TransportSession, relay_id: str, reply: dict[str, Any]
    ) -> None:
        """The client answered a request another replica relayed: that replica gets the answer."""
        await self._publish(
            ChangeKind.CLIENT_REPLIED, transport_session, {"relay_id": relay_id, "reply": reply}
        )

    async def _publish(
        self, kind: ChangeKind, transport_session: TransportSession, detail: dict[str, Any]
    ) -> None:
        writer, _ = self._credentials()
        try:
            await self._store.publish_change(
                kind, transport_session_key(transport_session.id), detail, origin=writer
            )
        except StoreError as exc:
            raise SessionStoreUnavailable() from exc

    async def terminate(self, transport_session: TransportSession, reason: str) -> None:
        """End the session at every replica (the change feed carries it). Raises :class:`StoreError`."""
        await self._store.terminate_transport_session(
            transport_session_key(transport_session.id), reason, self._wall_clock()
        )
