"""The change feed followed across replicas, on every engine (propagation/feed.py, issue #10)."""

from __future__ import annotations

import anyio
import pytest
from store_support import Writer, new_writer

from bastion.propagation.feed import PollingChangeFeed, notifications_for
from bastion.store.base import Store
from bastion.store.replicas import Change, ChangeKind

pytestmark = pytest.mark.anyio

WAIT_S = 20.0


async def test_a_follower_applies_each_later_change_once_in_order(
    store: Store, replica: Store, writer: Writer
) -> None:
    """A follower started at the head applies only later changes, each once, in publishing order."""
    await store.publish_change(ChangeKind.POLICY_RELOADED, "before", None, origin=writer.worker)
    feed = PollingChangeFeed(replica, interval_s=0.05)
    await feed.start()
    applied: list[str] = []
    done = anyio.Event()

    async def apply(change: Change) -> None:
        applied.append(change.subject)
        if len(applied) == 3:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.follow, apply)
        for subject in ("one", "two", "three"):
            await store.publish_change(ChangeKind.POLICY_RELOADED, subject, None, origin=writer.worker)
        with anyio.fail_after(WAIT_S):
            await done.wait()
        tg.cancel_scope.cancel()
    assert applied == ["one", "two", "three"]


async def test_a_change_that_fails_to_apply_does_not_stop_the_feed(
    store: Store, replica: Store, writer: Writer
) -> None:
    """An apply that raises is logged and passed; the next change is still applied."""
    feed = PollingChangeFeed(replica, interval_s=0.05)
    await feed.start()
    applied: list[str] = []

    async def apply(change: Change) -> None:
        if change.subject == "bad":
            raise RuntimeError("cannot apply")
        applied.append(change.subject)

    await store.publish_change(ChangeKind.POLICY_RELOADED, "bad", None, origin=writer.worker)
    await store.publish_change(ChangeKind.POLICY_RELOADED, "good", None, origin=writer.worker)
    assert await feed.poll_once(apply) == 2
    assert applied == ["good"] and feed.cursor == await store.latest_change()


async def test_without_a_notification_the_poll_still_delivers(
    store: Store, replica: Store, writer: Writer
) -> None:
    """With no listener at all (a lost notification), the poll alone delivers the change."""
    feed = PollingChangeFeed(replica, interval_s=0.2)
    await feed.start()
    seen = anyio.Event()

    async def apply(change: Change) -> None:
        seen.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.follow, apply)
        await store.publish_change(ChangeKind.AGENT_SESSION_REVOKED, "as_1", None, origin=writer.worker)
        with anyio.fail_after(WAIT_S):
            await seen.wait()
        tg.cancel_scope.cancel()


async def test_the_engine_notifies_at_commit_where_it_can(
    request: pytest.FixtureRequest, store: Store, replica: Store, writer: Writer
) -> None:
    """PostgreSQL's LISTEN nudges the feed when a change commits; SQLite has no listener (poll only)."""
    listen = notifications_for(replica)
    if request.node.callspec.params["store"] == "sqlite":
        assert listen is None
        return
    assert listen is not None
    nudged = anyio.Event()
    listening = anyio.Event()

    def nudge() -> None:
        if listening.is_set():
            nudged.set()
        listening.set()  # the first nudge comes when LISTEN is in place

    async with anyio.create_task_group() as tg:
        tg.start_soon(listen, nudge)
        with anyio.fail_after(WAIT_S):
            await listening.wait()
        await store.publish_change(ChangeKind.POLICY_RELOADED, "v9", None, origin=writer.worker)
        with anyio.fail_after(WAIT_S):
            await nudged.wait()
        tg.cancel_scope.cancel()


async def test_postgres_hands_out_feed_seqs_in_commit_order(postgres_url: str) -> None:
    """On PostgreSQL a change waits for an earlier, uncommitted one: a follower never skips a late commit."""
    import psycopg

    from bastion.store.postgres import PostgresStore

    published: list[int] = []
    async with await PostgresStore.connect(postgres_url) as store:
        writer = await new_writer(store, "gw-a-20260501T120000Z-abc1234", "gateway-0")
        async with await psycopg.AsyncConnection.connect(postgres_url) as held:
            cursor = await held.execute(
                "INSERT INTO changes (kind, subject, detail, origin, at)"
                " VALUES ('policy_reloaded', 'first, uncommitted', NULL, NULL, 0) RETURNING seq"
            )
            row = await cursor.fetchone()
            assert row is not None
            first = int(row[0])

            async def second() -> None:
                published.append(
                    await store.publish_change(
                        ChangeKind.POLICY_RELOADED, "second", None, origin=writer.worker
                    )
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                with anyio.move_on_after(0.5):
                    while not published:
                        await anyio.sleep(0.02)
                # Still waiting: had it committed now, a follower could read it and then skip ``first``.
                assert published == [] and await store.changes_after(0) == []
                await held.commit()
        assert published[0] > first
        assert [c.subject for c in await store.changes_after(0)] == ["first, uncommitted", "second"]
