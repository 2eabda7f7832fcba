"""`bastion serve` as an operator runs it: a real process, real signals (issue #11 points 7, 16, 17).

Every child it starts ends when it ends, whether it was stopped (SIGTERM) or
killed (SIGKILL); a clean stop logs no error; a refused start is one line
with its reason and a non-zero exit, and leaves no worker row behind; the
READY line names the upstreams that are not ready.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.cli.serve import EXIT_START_REFUSED

BASTION = [sys.executable, "-m", "bastion.cli.main"]
WAIT_S = 60.0
DEAD_URL = "http://127.0.0.1:9/mcp"  # the discard port: nothing answers
SHORT_LEASE = ("--port", "0", "--lease-s", "1", "--heartbeat-s", "0.5")


def children_of(pid: int) -> set[int]:
    """Direct children of ``pid`` (every thread's), from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until(predicate: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Serve:
    """One ``bastion serve`` process; its stdout is read up to the READY line.

    Its log (stderr) goes to a file, never a pipe: a pipe nobody reads fills at 64 KiB, and then
    every log line the gateway writes blocks its event loop (32 clients through `bastion serve`
    log about 80 KB: issue 22).
    """

    def __init__(self, *args: str) -> None:
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [*BASTION, "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def ready_line(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            assert line, f"bastion serve exited before READY: {self.stderr()}"
            if line.startswith("BASTION READY "):
                return line.strip()
        raise AssertionError("no READY line")

    def stderr(self) -> str:
        """What it has logged so far."""
        self._log.seek(0)
        return self._log.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=WAIT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


@pytest.fixture
def serving() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for serve in started:
        serve.stop()


def _config(tmp_path: Path, url: str = DEAD_URL) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(f'[servers.tools]\nurl = "{url}"\n')
    return path


def _demo_children(serve: Serve) -> set[int]:
    serve.ready_line()
    # The notes server (stdio) is launched as the gateway starts; the tools server before it.
    wait_until(lambda: len(children_of(serve.process.pid)) >= 2, "both demo upstreams")
    return children_of(serve.process.pid)


def test_sigterm_stops_the_demo_and_every_child_it_started(tmp_path: Path, serving: list[Serve]) -> None:
    """SIGTERM to `bastion serve` (demo) ends it with exit 0, ends both upstreams, and logs no error."""
    serve = Serve("--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    children = _demo_children(serve)
    serve.process.send_signal(signal.SIGTERM)
    code = serve.process.wait(timeout=WAIT_S)
    wait_until(lambda: all(gone(pid) for pid in children), "the demo upstreams to exit")
    log = serve.stderr()
    assert code == 0, log
    assert "store is closed" not in log
    assert '"level": "error"' not in log, log
    assert "Traceback" not in log


def test_a_killed_bastion_s_children_notice_and_exit(tmp_path: Path, serving: list[Serve]) -> None:
    """SIGKILL leaves no chance to clean up; the children still exit on their own (parent-death signal)."""
    serve = Serve("--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    children = _demo_children(serve)
    serve.process.kill()
    serve.process.wait(timeout=WAIT_S)
    wait_until(lambda: all(gone(pid) for pid in children), "the orphaned upstreams to exit")


def test_the_ready_line_names_upstreams_that_are_not_ready(tmp_path: Path, serving: list[Serve]) -> None:
    """An upstream that failed to connect is named on the READY line; the URL stays its third word."""
    serve = Serve("--config", str(_config(tmp_path)), "--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    words = serve.ready_line().split()
    assert words[2].startswith("http://127.0.0.1:") and words[2].endswith("/mcp")
    assert "not-ready=tools" in words


def _worker_rows(db: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return list(conn.execute("SELECT worker_id, generation FROM workers"))


def test_a_held_generation_refuses_the_start_in_one_line_and_leaves_no_row(
    tmp_path: Path, serving: list[Serve]
) -> None:
    """A second replica on a live replica's generation: exit 3, one line naming it, no worker row left."""
    config = str(_config(tmp_path))
    data = str(tmp_path / "data")
    holder = Serve("--config", config, "--data-dir", data, "--lease-s", "2", "--heartbeat-s", "0.3")
    serving.append(holder)
    holder.ready_line()
    before = _worker_rows(tmp_path / "data" / "bastion.db")
    refused = subprocess.run(
        [*BASTION, "serve", "--config", config, "--data-dir", data, *SHORT_LEASE],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert refused.returncode == EXIT_START_REFUSED, refused.stderr
    assert "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("bastion: start refused: generation_held:"), last
    assert "gateway-0" in last
    assert _worker_rows(tmp_path / "data" / "bastion.db") == before
    assert all(generation is not None for _, generation in before)


def test_an_unopenable_store_refuses_the_start_in_one_line(tmp_path: Path) -> None:
    """A store file that is not a database: exit 3, one line naming the file and the cause, file untouched."""
    data = tmp_path / "data"
    data.mkdir()
    garbage = b"not a database " * 100
    (data / "bastion.db").write_bytes(garbage)
    refused = subprocess.run(
        [*BASTION, "serve", "--config", str(_config(tmp_path)), "--data-dir", str(data), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert refused.returncode == EXIT_START_REFUSED, refused.stderr
    assert "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("bastion: start refused: store_error: cannot open the store file"), last
    assert "file is not a database" in last
    assert (data / "bastion.db").read_bytes() == garbage
