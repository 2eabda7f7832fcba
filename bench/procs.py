"""Child processes for the benchmark: start, wait for the readiness line, sample CPU, stop.

Every wait is bounded. A child's stdout is read for its readiness line and
then drained by a thread into its log file, and its stderr goes straight to
the log file, so a chatty child can never block on a full pipe. ``stop()``
sends SIGTERM, then SIGKILL, to the child's whole process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = [
    "Child",
    "StartFailed",
    "Terminated",
    "cpu_seconds",
    "free_port",
    "raise_on_signals",
    "rss_bytes",
    "run_to_end",
]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class StartFailed(Exception):
    """A child exited, or did not print its readiness line in time."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived: raised where the main thread is, so every ``finally`` on the way
    out stops what it started (children, a throwaway cluster, the temp dir), as on a normal exit.

    A ``KeyboardInterrupt``: ``except Exception`` never swallows it, and asyncio lets it through
    (it turns any other exception raised inside its transports into a connection error).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, frame: object) -> None:
    for each in (signal.SIGTERM, signal.SIGINT):
        signal.signal(each, signal.SIG_IGN)  # the cleanup that follows is not interrupted again
    raise Terminated(signum)


def raise_on_signals() -> None:
    """From now on SIGTERM and SIGINT raise :class:`Terminated` in the main thread (call it there)."""
    for each in (signal.SIGTERM, signal.SIGINT):
        signal.signal(each, _terminate)


def run_to_end(
    argv: Sequence[str], *, timeout_s: float, stdout: IO[str], grace_s: float = 60.0
) -> int | None:
    """Run a bench script; its exit status, or ``None`` past ``timeout_s``.

    Past the timeout, or when this process is interrupted (``Terminated``), the script gets
    SIGTERM, so it stops what it started itself, and ``grace_s`` to do so before SIGKILL.
    """
    process = subprocess.Popen(list(argv), stdout=stdout)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (/proc/<pid>/stat utime + stime)."""
    total_ticks = 0
    for each in _descendants(pid):
        try:
            stat = Path(f"/proc/{each}/stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesized command name; utime and stime are fields 14 and 15.
        fields = stat.rsplit(")", 1)[1].split()
        total_ticks += int(fields[11]) + int(fields[12])
    return total_ticks / _CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` and its live descendants, in bytes (/proc/<pid>/status VmRSS)."""
    total_kib = 0
    for each in _descendants(pid):
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
                break
    return total_kib * 1024


def _drain(stream: IO[bytes], sink: IO[bytes]) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
        sink.write(chunk)
        sink.flush()


@dataclass
class Child:
    """One started child process and what it announced."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_line: str
    ready_after_s: float
    _log: IO[bytes] = field(repr=False)
    _drainer: threading.Thread | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        *,
        ready: re.Pattern[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        timeout_s: float,
    ) -> Child:
        """Start ``argv`` and wait for a stdout line matching ``ready``. Raises ``StartFailed``."""
        log = log_path.open("wb")
        started = time.perf_counter()
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # its own process group, so stop() reaches its children too
        )
        assert process.stdout is not None
        child = cls(name, process, log_path, "", 0.0, log)
        try:
            child.ready_line = child._await_line(ready, started + timeout_s)
        except BaseException:
            child.stop()
            raise
        child.ready_after_s = time.perf_counter() - started
        child._drainer = threading.Thread(target=_drain, args=(process.stdout, log), daemon=True)
        child._drainer.start()
        return child

    @classmethod
    def start_listening(
        cls, name: str, argv: Sequence[str], *, port: int, log_path: Path, timeout_s: float
    ) -> Child:
        """Start ``argv`` (a daemon that prints nothing, such as nginx) and wait until ``port`` accepts.

        Its stdout and stderr both go to ``log_path``. Raises ``StartFailed`` when it exits first or the
        port does not accept within ``timeout_s``.
        """
        import socket

        log = log_path.open("wb")
        started = time.perf_counter()
        process = subprocess.Popen(
            list(argv), stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
        child = cls(name, process, log_path, f"listening on 127.0.0.1:{port}", 0.0, log)
        try:
            while True:
                if process.poll() is not None:
                    raise StartFailed(f"{name}: exited with status {process.returncode}; see {log_path}")
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                if time.perf_counter() - started > timeout_s:
                    raise StartFailed(f"{name}: port {port} not accepting in time; see {log_path}")
                time.sleep(0.02)
        except BaseException:
            child.stop()
            raise
        child.ready_after_s = time.perf_counter() - started
        return child

    def _await_line(self, ready: re.Pattern[str], deadline: float) -> str:
        stdout = self.process.stdout
        assert stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(stdout, selectors.EVENT_READ)
        pending = b""
        try:
            while True:
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise StartFailed(f"{self.name}: no readiness line in time; see {self.log_path}")
                if not selector.select(timeout=left):
                    continue
                chunk: bytes = stdout.read1(65536)  # type: ignore[attr-defined]
                if not chunk:
                    status = self.process.wait(timeout=5)
                    raise StartFailed(f"{self.name}: exited with status {status}; see {self.log_path}")
                self._log.write(chunk)
                self._log.flush()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace").strip()
                    if ready.search(text):
                        return text
        finally:
            selector.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the child's process group, SIGKILL after ``grace_s``; return its exit status."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=grace_s)
        if self._drainer is not None:
            self._drainer.join(timeout=grace_s)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        return self.process.returncode
