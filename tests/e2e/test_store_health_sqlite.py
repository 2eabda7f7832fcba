"""An idle replica on SQLite learns that its store stopped taking writes (issue #23 points 2 and 5).

SQLite has no server to lose; what fails is the write (disk full, I/O error,
a lost lock). The replica's heartbeat is a write every ``heartbeat_s``: with
no traffic, a failing one turns ``/readyz`` 503 with ``store.degraded: true``
within that bound, and 200 again once writes work. A read that fails names
the file.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import httpx
import pytest

from bastion.app import create_app
from bastion.errors import StoreError
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.store.base import Store
from bastion.store.health import DEGRADED_WITHIN_S
from bastion.store.sqlite import SqliteStore
from tests.e2e.conftest import Upstream, gateway_config
from tests.e2e.issue4_support import auth_table
from tests.e2e.test_execution_durability import readiness
from tests.support.faulty_store import FaultyStore
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

HEARTBEAT_S = 2.0  # the default of `bastion serve`
SLACK_S = 1.5  # a loaded two-core machine


async def _until(http: httpx.AsyncClient, url: str, degraded: bool) -> float:
    started = time.monotonic()
    with anyio.fail_after(30):
        while (await readiness(http, url))["store"]["degraded"] is not degraded:
            await anyio.sleep(0.05)
    return time.monotonic() - started


async def test_an_idle_sqlite_replica_whose_writes_fail_turns_unready_and_back(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """No traffic; heartbeats start failing: 503 within the heartbeat bound, 200 once writes work."""
    made: list[FaultyStore] = []

    def wrap(inner: Store) -> Store:
        made.append(FaultyStore(inner, fail_at="heartbeat", times=0))
        return made[-1]

    config = {**gateway_config(tmp_path, tools_upstream.url), "auth": auth_table()}
    app = create_app(
        snapshot_from_mapping(config, source=None, version="health"),
        RuntimeOptions(data_dir=tmp_path / "data", store_factory=wrap, heartbeat_s=HEARTBEAT_S),
    )
    async with serve_on_loopback(app) as url, httpx.AsyncClient(timeout=30) as http:
        await _until(http, url, degraded=False)
        made[0].fail_again(None)
        down = await _until(http, url, degraded=True)
        detail = await readiness(http, url)
        assert detail["ready"] is False and detail["store"]["reason"]
        made[0].recover()
        up = await _until(http, url, degraded=False)
        assert (await readiness(http, url))["ready"] is True
    print(f"\nsqlite: writes fail -> 503: {down:.2f} s; writes work -> 200: {up:.2f} s")
    assert down <= max(HEARTBEAT_S, DEGRADED_WITHIN_S) + SLACK_S
    assert up <= HEARTBEAT_S + SLACK_S


async def test_a_sqlite_read_that_fails_names_the_file(tmp_path: Path) -> None:
    """The store file replaced under a running store: the read refusal names the file's path."""
    path = tmp_path / "bastion.db"
    async with await SqliteStore.open(path) as store:
        for leftover in (path, path.with_name("bastion.db-wal"), path.with_name("bastion.db-shm")):
            leftover.unlink(missing_ok=True)
        path.write_bytes(b"not a database " * 100)
        with pytest.raises(StoreError) as caught:
            await store.probe(2.0)
    assert caught.value.message == f"the store file {path} could not be read"
    assert caught.value.cause == "the store file is not a SQLite database (damaged)"
