"""Contract: transport sessions as records, the change feed and policy reports, on every engine (#10)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from store_support import AGENT, NOW, Writer, new_writer

from bastion.errors import Conflict, StaleEpoch
from bastion.ids import Epoch, WorkerId
from bastion.store.base import Store
from bastion.store.replicas import ChangeKind, TransportSessionRecord, transport_session_key

pytestmark = pytest.mark.anyio

SESSION_ID = "b" * 48


def record(key: str = transport_session_key(SESSION_ID), *, by: WorkerId) -> TransportSessionRecord:
    return TransportSessionRecord(
        key=key,
        agent=AGENT,
        agent_session_id="as_1",
        credential_id="cred_1",
        protocol_version="2025-06-18",
        client_capabilities={"sampling": {}, "roots": {"listChanged": True}},
        client_info={"name": "pytest-client", "version": "1"},
        created_at=NOW,
        last_seen_at=NOW,
        created_by=by,
    )


async def test_a_transport_session_written_at_one_replica_reads_back_whole_at_another(
    store: Store, replica: Store, writer: Writer
) -> None:
    """Every field written at one replica (owner, version, capabilities, info) is read at the other."""
    await store.create_transport_session(record(by=writer.worker), writer=writer.worker, epoch=writer.epoch)
    loaded = await replica.get_transport_session(transport_session_key(SESSION_ID))
    assert loaded == record(by=writer.worker)
    assert await replica.get_transport_session(transport_session_key("other")) is None


async def test_the_session_id_itself_is_never_the_key() -> None:
    """The key is the SHA-256 of the id, so the stored rows do not carry a usable session id."""
    key = transport_session_key(SESSION_ID)
    assert SESSION_ID not in key and len(key) == 64


async def test_a_transport_session_key_is_never_reused(store: Store, writer: Writer) -> None:
    """Creating a session whose key exists raises Conflict."""
    await store.create_transport_session(record(by=writer.worker), writer=writer.worker, epoch=writer.epoch)
    with pytest.raises(Conflict):
        await store.create_transport_session(
            record(by=writer.worker), writer=writer.worker, epoch=writer.epoch
        )


async def test_a_stale_writer_creates_and_touches_nothing(store: Store, writer: Writer) -> None:
    """A writer whose epoch is not current can neither create nor touch a session."""
    stale = Epoch(writer.epoch + 1)
    with pytest.raises(StaleEpoch):
        await store.create_transport_session(record(by=writer.worker), writer=writer.worker, epoch=stale)
    assert await store.get_transport_session(transport_session_key(SESSION_ID)) is None
    await store.create_transport_session(record(by=writer.worker), writer=writer.worker, epoch=writer.epoch)
    with pytest.raises(StaleEpoch):
        await store.touch_transport_sessions(
            [transport_session_key(SESSION_ID)], NOW + timedelta(minutes=1), writer=writer.worker, epoch=stale
        )
    loaded = await store.get_transport_session(transport_session_key(SESSION_ID))
    assert loaded is not None and loaded.last_seen_at == NOW


async def test_touch_moves_last_seen_forward_only_and_leaves_ended_sessions_alone(
    store: Store, writer: Writer
) -> None:
    """A touch never moves last_seen_at back, and a terminated session is not touched."""
    key = transport_session_key(SESSION_ID)
    ended = transport_session_key("ended")
    await store.create_transport_session(record(by=writer.worker), writer=writer.worker, epoch=writer.epoch)
    await store.create_transport_session(
        record(ended, by=writer.worker), writer=writer.worker, epoch=writer.epoch
    )
    assert await store.terminate_transport_session(ended, "client_delete", NOW)
    later = NOW + timedelta(seconds=30)
    await store.touch_transport_sessions([key, ended], later, writer=writer.worker, epoch=writer.epoch)
    await store.touch_transport_sessions([key], NOW, writer=writer.worker, epoch=writer.epoch)
    touched = await store.get_transport_session(key)
    untouched = await store.get_transport_session(ended)
    assert touched is not None and touched.last_seen_at == later
    assert untouched is not None and untouched.last_seen_at == NOW


async def test_the_first_termination_wins_and_enters_the_feed_once(
    store: Store, replica: Store, writer: Writer
) -> None:
    """Terminating twice ends the session once; the feed carries one termination with its reason."""
    key = transport_session_key(SESSION_ID)
    start = await replica.latest_change()
    await store.create_transport_session(record(by=writer.worker), writer=writer.worker, epoch=writer.epoch)
    assert await store.terminate_transport_session(key, "client_delete", NOW) is True
    assert await replica.terminate_transport_session(key, "idle_expiry", NOW) is False
    loaded = await replica.get_transport_session(key)
    assert loaded is not None and loaded.terminated_at == NOW and loaded.terminate_reason == "client_delete"
    changes = await replica.changes_after(start)
    assert [(c.kind, c.subject, c.detail) for c in changes] == [
        (ChangeKind.TRANSPORT_SESSION_TERMINATED, key, {"reason": "client_delete"})
    ]


async def test_a_revocation_enters_the_feed_whoever_writes_it(store: Store, replica: Store) -> None:
    """Revoking an agent session (an admin write, no replica involved) puts one change in the feed."""
    start = await replica.latest_change()
    agent_session = await store.create_agent_session(
        human="ada", agent=AGENT, team=None, scopes=frozenset(), now=NOW, expires_at=NOW + timedelta(hours=1)
    )
    await store.revoke_agent_session(agent_session.agent_session_id, by="admin", reason="test", now=NOW)
    await store.revoke_agent_session(agent_session.agent_session_id, by="admin", reason="again", now=NOW)
    changes = await replica.changes_after(start)
    assert [(c.kind, c.subject) for c in changes] == [
        (ChangeKind.AGENT_SESSION_REVOKED, agent_session.agent_session_id)
    ]


async def test_published_changes_come_back_in_order_after_a_cursor(
    store: Store, replica: Store, writer: Writer
) -> None:
    """Changes read after a cursor are the later ones, in publishing order, with their detail and origin."""
    start = await replica.latest_change()
    first = await store.publish_change(
        ChangeKind.REQUEST_CANCELLED, "k1", {"request_id": 7}, origin=writer.worker
    )
    second = await store.publish_change(ChangeKind.POLICY_RELOADED, "v2", None, origin=writer.worker)
    assert start < first < second == await replica.latest_change()
    changes = await replica.changes_after(start)
    assert [(c.seq, c.kind, c.subject, c.detail, c.origin) for c in changes] == [
        (first, ChangeKind.REQUEST_CANCELLED, "k1", {"request_id": 7}, writer.worker),
        (second, ChangeKind.POLICY_RELOADED, "v2", None, writer.worker),
    ]
    assert [c.seq for c in await replica.changes_after(first)] == [second]
    assert [c.seq for c in await replica.changes_after(start, limit=1)] == [first]


async def test_pruning_never_hands_a_seq_out_twice(store: Store, writer: Writer) -> None:
    """Pruning keeps only the newest change (the feed's head); a new change still gets a higher seq."""
    await store.publish_change(ChangeKind.POLICY_RELOADED, "v1", None, origin=writer.worker)
    seq = await store.publish_change(ChangeKind.POLICY_RELOADED, "v2", None, origin=writer.worker)
    assert await store.prune_changes(NOW + timedelta(days=3650)) >= 1
    assert [c.seq for c in await store.changes_after(0)] == [seq] and await store.latest_change() == seq
    assert await store.publish_change(ChangeKind.POLICY_RELOADED, "v3", None, origin=writer.worker) > seq


async def test_policy_reports_keep_each_workers_latest(store: Store, writer: Writer) -> None:
    """A worker's later report replaces its earlier one; every worker's report is listed."""
    other = await new_writer(store, "gw-b-20260501T120000Z-abc1234", "gateway-1")
    await store.report_policy("v1", None, NOW, writer=writer.worker, epoch=writer.epoch)
    await store.report_policy("v1", None, NOW, writer=other.worker, epoch=other.epoch)
    later = NOW + timedelta(seconds=5)
    await store.report_policy("v2", None, later, writer=writer.worker, epoch=writer.epoch)
    reports = {
        r.worker_id: (r.policy_version, r.reload_error, r.reported_at)
        for r in await store.list_policy_reports()
    }
    assert reports == {writer.worker: ("v2", None, later), other.worker: ("v1", None, NOW)}
    with pytest.raises(StaleEpoch):
        await store.report_policy("v3", None, later, writer=writer.worker, epoch=Epoch(writer.epoch + 1))


async def test_listing_gives_every_replica_the_live_sessions_only(
    store: Store, replica: Store, writer: Writer
) -> None:
    """Issue #26 point 9: not terminated and seen since the bound, oldest first, at any replica."""
    live, idle, ended = (transport_session_key(name) for name in ("live", "idle", "ended"))
    old = NOW - timedelta(hours=2)
    for key in (live, ended):
        await store.create_transport_session(
            record(key, by=writer.worker), writer=writer.worker, epoch=writer.epoch
        )
    idle_record = dataclasses.replace(record(idle, by=writer.worker), created_at=old, last_seen_at=old)
    await store.create_transport_session(idle_record, writer=writer.worker, epoch=writer.epoch)
    await store.terminate_transport_session(ended, "deleted", NOW)
    listed = await replica.list_transport_sessions(seen_since=NOW - timedelta(minutes=30))
    assert [r.key for r in listed] == [live]
    everything = await replica.list_transport_sessions(seen_since=old)
    assert [r.key for r in everything] == [idle, live]  # oldest first
    assert everything[1] == record(live, by=writer.worker)
