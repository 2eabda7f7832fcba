"""A used data directory never starts on a fresh SQLite store by accident (issue #23 point 1).

``bastion serve`` as an operator runs it: a real process on a data directory it
used before (its ``keys/`` are there). The store file emptied to 0 bytes or
deleted refuses the start with exit 3 and one line naming the file, unless
``--discard-store-and-start-empty`` asks for a new store (and the start says it
did). A store file copied from another data directory is refused too, naming
the directory it belongs to.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from bastion.cli.serve import EXIT_START_REFUSED
from tests.e2e.test_serve_process import BASTION, WAIT_S, Serve, _config


def _serve_once(tmp_path: Path, data: Path) -> None:
    """Start ``bastion serve`` on ``data`` until READY, then stop it cleanly (SIGTERM)."""
    serve = Serve("--config", str(_config(tmp_path)), "--data-dir", str(data))
    try:
        serve.ready_line()
        serve.process.send_signal(signal.SIGTERM)
        assert serve.process.wait(timeout=WAIT_S) == 0, serve.stderr()
    finally:
        serve.stop()


def _start(tmp_path: Path, data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """A start that is expected to end by itself (refused)."""
    return subprocess.run(
        [
            *BASTION,
            "serve",
            "--config",
            str(_config(tmp_path)),
            "--data-dir",
            str(data),
            "--port",
            "0",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def _damage(store_file: Path, how: str) -> None:
    for side in ("-wal", "-shm"):
        store_file.with_name(store_file.name + side).unlink(missing_ok=True)
    if how == "emptied":
        store_file.write_bytes(b"")
    else:
        store_file.unlink()


@pytest.mark.parametrize(("how", "said"), [("emptied", "is empty (0 bytes)"), ("deleted", "is missing")])
def test_a_lost_store_file_in_a_used_data_directory_refuses_the_start(
    tmp_path: Path, how: str, said: str
) -> None:
    """Emptied or deleted: exit 3, one line naming the file; nothing is created in its place."""
    data = tmp_path / "data"
    _serve_once(tmp_path, data)
    store_file = data / "bastion.db"
    _damage(store_file, how)

    refused = _start(tmp_path, data)

    assert refused.returncode == EXIT_START_REFUSED, refused.stderr
    assert "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bastion: start refused: store_missing: the store file {store_file} {said}"), last
    assert "--discard-store-and-start-empty" in last
    assert (not store_file.exists()) if how == "deleted" else store_file.stat().st_size == 0


@pytest.mark.parametrize("how", ["emptied", "deleted"])
def test_the_discard_flag_starts_an_empty_store_and_says_so(tmp_path: Path, how: str) -> None:
    """``--discard-store-and-start-empty``: the start goes on with a new store and logs that it did."""
    data = tmp_path / "data"
    _serve_once(tmp_path, data)
    _damage(data / "bastion.db", how)

    serve = Serve(
        "--config", str(_config(tmp_path)), "--data-dir", str(data), "--discard-store-and-start-empty"
    )
    try:
        serve.ready_line()
        serve.process.send_signal(signal.SIGTERM)
        assert serve.process.wait(timeout=WAIT_S) == 0
        log = serve.stderr()
    finally:
        serve.stop()
    assert "store discarded: starting with an empty store (--discard-store-and-start-empty)" in log, log
    assert (data / "bastion.db").stat().st_size > 0
    # The new store is this directory's from now on: a plain start takes it.
    _serve_once(tmp_path, data)


def test_a_store_file_copied_from_another_data_directory_is_refused(tmp_path: Path) -> None:
    """Another directory's store (another signing key): exit 3, naming the directory it belongs to."""
    first, second = tmp_path / "first", tmp_path / "second"
    _serve_once(tmp_path, first)
    _serve_once(tmp_path, second)
    _damage(second / "bastion.db", "deleted")
    shutil.copyfile(first / "bastion.db", second / "bastion.db")
    copied = (second / "bastion.db").read_bytes()

    refused = _start(tmp_path, second)

    assert refused.returncode == EXIT_START_REFUSED, refused.stderr
    assert "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"bastion: start refused: store_foreign: the store belongs to the data directory {first}"
    )
    assert f"not to {second}" in last
    assert (second / "bastion.db").read_bytes() == copied  # left as it was, for the operator
    # The flag throws away only a missing or empty store, never another directory's.
    assert _start(tmp_path, second, "--discard-store-and-start-empty").returncode == EXIT_START_REFUSED
