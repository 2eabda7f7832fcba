"""Fixtures of the store contract tests: one body of tests, every engine.

``store`` is parametrized over :data:`ENGINES`: the SQLite file of the test's
temporary directory, and a fresh database of the run's throwaway PostgreSQL
cluster (``postgres_url`` in ``tests/conftest.py``: skipped where PostgreSQL is
not installed, failed in CI). ``replica`` opens the same data again: another
gateway replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from store_support import Writer, genesis, new_writer

from bastion.ids import EvidenceSessionId
from bastion.store.base import Store
from bastion.store.postgres import PostgresStore
from bastion.store.sqlite import SqliteStore


async def _open_sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return await SqliteStore.open(tmp_path / "bastion.db")


async def _open_postgres(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return await PostgresStore.connect(request.getfixturevalue("postgres_url"))


ENGINES: dict[str, Callable[[pytest.FixtureRequest, Path], Awaitable[Store]]] = {
    "sqlite": _open_sqlite,
    "postgres": _open_postgres,
}


@pytest.fixture(params=sorted(ENGINES))
async def store(request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str) -> AsyncIterator[Store]:
    opened = await ENGINES[request.param](request, tmp_path)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def writer(store: Store) -> Writer:
    return await new_writer(store, "gw-a-20260501T120000Z-abc1234", "gateway-0")


@pytest.fixture
async def chain(store: Store, writer: Writer) -> EvidenceSessionId:
    """An open chain holding only its genesis entry."""
    session_id = EvidenceSessionId("ev_chain")
    await store.open_chain(session_id, genesis(session_id), worker=writer.worker, epoch=writer.epoch)
    return session_id


@pytest.fixture
async def replica(request: pytest.FixtureRequest, store: Store, tmp_path: Path) -> AsyncIterator[Store]:
    """A second store on the same backing data as ``store``: another replica of the gateway."""
    opened = await ENGINES[request.node.callspec.params["store"]](request, tmp_path)
    try:
        yield opened
    finally:
        await opened.aclose()
