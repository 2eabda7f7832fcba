"""Shared pytest configuration: anyio on asyncio for every async test; a throwaway PostgreSQL cluster."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pg_cluster import PostgresUnavailable, ThrowawayCluster


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[ThrowawayCluster]:
    """One PostgreSQL cluster for the whole run, started on first use, deleted at the end.

    Missing PostgreSQL skips the tests that need it on a developer's machine
    and fails them in CI (``CI=true``), where ``.ci/run`` installs it.
    """
    cluster = start_cluster_or_skip()
    try:
        yield cluster
    finally:
        cluster.stop()


def start_cluster_or_skip(*, durable: bool = False) -> ThrowawayCluster:
    """A new throwaway cluster; skips without PostgreSQL locally, fails in CI (``CI=true``)."""
    try:
        return ThrowawayCluster.start(durable=durable)
    except PostgresUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"PostgreSQL is not installed: {exc}")


def schema_name(tmp_path: Path) -> str:
    """One test's schema: named from its temporary directory, so every opener of that test shares it."""
    return "t_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:20]


@pytest.fixture
def postgres_url(postgres_cluster: ThrowawayCluster, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty schema of the cluster for one test (its URL sets the search_path; dropped after)."""
    name = schema_name(tmp_path)
    url = postgres_cluster.create_schema(name)
    try:
        yield url
    finally:
        postgres_cluster.drop_schema(name)
