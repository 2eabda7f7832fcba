"""``bench/run.py`` stopped by SIGTERM or SIGINT leaves nothing running (bench/procs.py ``Terminated``).

The bench is started with tiny counts but far too many measured calls to finish, and a
mark in its environment that every process it starts inherits (the upstream, ``bastion
serve``, a throwaway PostgreSQL cluster). Once it says a Bastion is ready, it gets one
signal: it must exit with 128 + the signal's number, after the same cleanup as a normal
exit: no marked process left, its temp dir removed, its cluster's directory removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from tests.e2e.test_bench_table import _bench_module, _postgres_available

REPO = Path(__file__).resolve().parents[2]
MARK = "BASTION_BENCH_SIGNAL_TEST"
START_S = 120.0
STOP_S = 60.0


def _marked(mark: str) -> list[int]:
    """Every live process whose environment carries ``MARK=mark``."""
    wanted = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if wanted in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
    return found


def _described(pid: int) -> str:
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state + " " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    return "gone"


def _cluster_roots(pids: list[int]) -> set[Path]:
    """The throwaway cluster directories the ``postgres`` processes among ``pids`` serve."""
    roots = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            if "-D" in argv[:-1] and "bastion-pg-" in argv[argv.index("-D") + 1]:
                roots.add(Path(argv[argv.index("-D") + 1]).parent)
    return roots


def _await_line(stream: IO[bytes], needle: str, timeout_s: float) -> str:
    """Read ``stream`` until a line holds ``needle``; everything read so far, or a failure at the deadline."""
    deadline = time.monotonic() + timeout_s
    seen = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while needle.encode() not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no {needle!r} within {timeout_s:g} s; stderr so far: {seen.decode()[-2000:]}")
            if selector.select(timeout=left):
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    pytest.fail(f"the bench ended before {needle!r}: {seen.decode()[-2000:]}")
                seen += chunk
    return seen.decode(errors="replace")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("signum", "postgres"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["sigterm", "sigint", "sigterm-postgres"],
)
def test_a_signalled_bench_stops_everything_it_started(tmp_path: Path, signum: int, postgres: bool) -> None:
    """One signal once Bastion is ready: exit 128 + signal, no process, temp dir or cluster left."""
    if postgres and not _postgres_available():
        pytest.skip("PostgreSQL server programs are not installed")
    mark = secrets.token_hex(8)
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    argv = [
        sys.executable, str(REPO / "bench" / "run.py"),
        "--sessions", "1", "--calls", "10000000", "--warmup", "1", "--latency-calls", "1",
        "--out", str(tmp_path / "never.json"),
    ]  # fmt: skip
    if postgres:
        argv += ["--postgres", "--store-ops-calls", "0"]
    ready = "bench: bastion-postgres ready" if postgres else "bench: bastion ready"
    env = {**os.environ, "TMPDIR": str(temp_root), MARK: mark}
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    started: list[int] = []
    try:
        _await_line(process.stderr, ready, START_S)
        started = _marked(mark)
        clusters = _cluster_roots(started)
        assert len(started) >= 3, started  # the bench, the upstream, bastion serve (and more)
        assert bool(clusters) is postgres, clusters
        process.send_signal(signum)
        status = process.wait(timeout=STOP_S)
        said = process.stderr.read().decode(errors="replace")
        deadline = time.monotonic() + 5.0  # what exited is reaped by then; nothing should be left
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = {pid: _described(pid) for pid in _marked(mark)}
    finally:
        for pid in [process.pid, *_marked(mark)]:  # never leave this test's processes behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=10)
        process.stderr.close()
    assert status == 128 + signum, said
    assert f"stopped by {signal.Signals(signum).name}" in said
    assert survivors == {}, survivors
    assert list(temp_root.iterdir()) == []
    assert not any(root.exists() for root in clusters)


def test_a_bench_script_past_its_timeout_gets_sigterm_before_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make bench``'s per-script timeout sends SIGTERM (the script cleans up), not SIGKILL."""
    procs = _bench_module("procs", monkeypatch)
    said = tmp_path / "said"
    script = (
        "import pathlib, signal, sys, time\n"
        "def stop(*_):\n"
        "    pathlib.Path(sys.argv[1]).write_text('term')\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(60)\n"
    )
    with (tmp_path / "out").open("w") as out:
        status = procs.run_to_end(
            [sys.executable, "-c", script, str(said)], timeout_s=3.0, stdout=out, grace_s=10
        )
    assert status is None
    assert said.read_text() == "term"
