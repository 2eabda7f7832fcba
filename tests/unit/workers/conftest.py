"""Fixtures of the worker tests: a real SQLite store, an injected clock, a real dead PID."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from workers_support import Clock

from bastion.store.sqlite import SqliteStore


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(tmp_path: Path, anyio_backend: str) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(tmp_path / "bastion.db")
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
def dead_pid() -> int:
    """The PID of a real child process this test started, killed and reaped: known dead."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    child.wait(timeout=10)
    return child.pid


@pytest.fixture
def live_child() -> Iterator[subprocess.Popen[bytes]]:
    """A real child process that stays alive for the test (killed afterwards)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)
