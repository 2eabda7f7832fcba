"""Transport sessions shared through the store (session/shared.py, issue #10), on a real SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bastion.audit.scope import EvidenceScope
from bastion.auth.principal import Principal
from bastion.errors import SessionNotFound
from bastion.ids import AgentId, Epoch, WorkerId
from bastion.session.registry import SessionRegistry
from bastion.session.shared import SharedSessions
from bastion.store.replicas import transport_session_key
from bastion.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

IDLE_S = 60.0
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ALICE = Principal(AgentId("alice"), credential_id="cred-a")


@dataclass
class Replica:
    registry: SessionRegistry
    shared: SharedSessions


@dataclass
class Wall:
    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now


def no_evidence(agent: AgentId) -> EvidenceScope:
    # Never opened in these tests: a scope is lazy, and nothing here records.
    return EvidenceScope.__new__(EvidenceScope)


async def replica(store: SqliteStore, name: str, wall: Wall) -> Replica:
    worker = WorkerId(f"gw-{name}-20260501T120000Z-abc1234")
    await store.register_worker(worker, "gateway", {"test": name}, now=T0)
    epoch = await store.claim_generation(f"gateway-{name}", worker, now=T0, lease_s=30)
    registry = SessionRegistry(idle_timeout_s=IDLE_S, max_sessions=10)

    def credentials() -> tuple[WorkerId, Epoch]:
        return worker, epoch

    shared = SharedSessions(
        registry, store, credentials, no_evidence, idle_timeout_s=lambda: IDLE_S, wall_clock=wall
    )
    return Replica(registry, shared)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(tmp_path / "bastion.db") as opened:
        yield opened


async def opened_at(first: Replica, principal: Principal = ALICE) -> Any:
    session = first.registry.create(
        principal, "2025-06-18", {"sampling": {}}, {"name": "c"}, no_evidence(principal.agent)
    )
    await first.shared.record_opened(session)
    return session


async def test_another_replica_loads_the_session_with_its_capabilities(store: SqliteStore) -> None:
    """A session opened at A is served at B with A's negotiated version, capabilities and client info."""
    wall = Wall()
    a, b = await replica(store, "a", wall), await replica(store, "b", wall)
    session = await opened_at(a)
    loaded = await b.shared.load(session.id, ALICE)
    assert (loaded.protocol_version, dict(loaded.client_capabilities), dict(loaded.client_info)) == (
        "2025-06-18",
        {"sampling": {}},
        {"name": "c"},
    )
    assert b.registry.get(session.id, ALICE) is loaded  # held at B from now on: no second load
    assert loaded is not session  # B's own record: nothing of A's per-session state is shared


@pytest.mark.parametrize(
    ("principal", "cause"),
    [
        (Principal(AgentId("bob"), credential_id="cred-b"), "foreign"),
        (Principal(AgentId("alice"), credential_id="cred-renewed"), "foreign"),
    ],
)
async def test_another_principal_gets_not_found(store: SqliteStore, principal: Principal, cause: str) -> None:
    """Another agent, or another credential of the same agent, is answered as if the id were unknown."""
    wall = Wall()
    a, b = await replica(store, "a", wall), await replica(store, "b", wall)
    session = await opened_at(a)
    with pytest.raises(SessionNotFound) as caught:
        await b.shared.load(session.id, principal)
    assert caught.value.cause == cause and len(b.registry) == 0


async def test_unknown_terminated_and_idle_sessions_are_not_found(store: SqliteStore) -> None:
    """An unknown id, a terminated session and one idle past the timeout everywhere all answer not found."""
    wall = Wall()
    a, b = await replica(store, "a", wall), await replica(store, "b", wall)
    with pytest.raises(SessionNotFound) as unknown:
        await b.shared.load("no-such-session", ALICE)
    ended, idle = await opened_at(a), await opened_at(a)
    await a.shared.terminate(ended, "client_delete")
    with pytest.raises(SessionNotFound) as terminated:
        await b.shared.load(ended.id, ALICE)
    wall.now = T0 + timedelta(seconds=IDLE_S + 1)
    with pytest.raises(SessionNotFound) as expired:
        await b.shared.load(idle.id, ALICE)
    assert (unknown.value.cause, terminated.value.cause, expired.value.cause) == (
        "unknown",
        "terminated",
        "expired",
    )


async def test_use_at_one_replica_keeps_the_session_alive_for_the_others(store: SqliteStore) -> None:
    """Touches flushed by B move the shared last use on, so A does not end a session B still serves."""
    wall = Wall()
    a, b = await replica(store, "a", wall), await replica(store, "b", wall)
    session = await opened_at(a)
    await b.shared.load(session.id, ALICE)
    wall.now = T0 + timedelta(seconds=IDLE_S - 1)
    b.registry.get(session.id, ALICE)  # a request at B
    await b.shared.flush_touches()
    wall.now = T0 + timedelta(seconds=IDLE_S + 1)
    assert await a.shared.idle_everywhere(session) is False
    wall.now = T0 + timedelta(seconds=2 * IDLE_S)
    assert await a.shared.idle_everywhere(session) is True
    record = await store.get_transport_session(transport_session_key(session.id))
    assert record is not None and record.last_seen_at == T0 + timedelta(seconds=IDLE_S - 1)
