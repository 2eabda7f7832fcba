"""Structured logs: one JSON object per line on stderr, written off the event loop.

Never log a credential: the formatter emits only the message, the level, the
logger and the ``extra`` fields the code chose to attach.

A log call never waits for stderr. Records go to a bounded queue and one
thread writes them, in batches (:class:`_LineWriter`): a reader that stops reading (a full
pipe, a stopped terminal, a slow log shipper) stalls that thread, never the
gateway's event loop. When the queue is full, records are dropped and counted,
and the writer says how many in one line as soon as it can write again; the
queue is drained at exit.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from typing import TextIO

__all__ = ["configure_logging", "say"]

# uvicorn's ``color_message`` (the message again, with ANSI colour codes) is for terminals only.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}
# Values written as they are (anything else as its str()); a tuple: isinstance is quicker on one.
_PLAIN = (str, int, float, bool, type(None))
# json.dumps(entry, ensure_ascii=False) builds a new encoder per line; this one is stateless.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, _PLAIN) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return _ENCODER.encode(entry)


_QUEUE_RECORDS = 10_000
_STOP = None  # the sentinel that ends the writer thread


class _LineWriter(logging.Handler):
    """Formats on the caller's thread, writes on its own: a blocked stream never blocks a log call.

    A line is appended to a deque (atomic under the GIL) and the writer is woken only when it
    sleeps; awake, it takes every line queued and writes them with one write and one flush. So a
    busy gateway pays neither a lock round nor a thread wake-up per line, and a burst costs one
    system call, not one per line (issue #28).
    """

    def __init__(self, stream: TextIO, *, capacity: int = _QUEUE_RECORDS) -> None:
        super().__init__()
        self._stream = stream
        self._capacity = capacity
        self._lines: collections.deque[str | threading.Event | None] = collections.deque()
        self._wake = threading.Event()
        self._dropped = 0
        self._dropped_lock = threading.Lock()
        self._thread = threading.Thread(target=self._write_lines, name="bastion-log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if not self._offer(line):
            with self._dropped_lock:
                self._dropped += 1

    def _offer(self, item: str | threading.Event | None) -> bool:
        """Queue ``item`` for the writer; False when the queue is full (a stream nobody reads)."""
        if len(self._lines) >= self._capacity:
            return False
        self._lines.append(item)
        if not self._wake.is_set():
            self._wake.set()
        return True

    def _take_dropped(self) -> int:
        with self._dropped_lock:
            dropped, self._dropped = self._dropped, 0
        return dropped

    def _offer_within(self, item: threading.Event | None, timeout_s: float) -> bool:
        """Queue a marker, waiting (at most ``timeout_s``) for room in a full queue."""
        deadline = time.monotonic() + timeout_s
        while not self._offer(item):
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(0.01)
        return True

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait (at most ``timeout_s``) until every line queued so far is written."""
        if not self._thread.is_alive():
            return
        written = threading.Event()
        if self._offer_within(written, timeout_s):
            written.wait(timeout=timeout_s)

    def _write_lines(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()  # before taking: a line queued from here on wakes the next round
            lines: list[str] = []
            while self._lines:
                item = self._lines.popleft()
                if isinstance(item, str):
                    lines.append(item)
                    continue
                self._write(lines)  # what came before a marker is out before it is answered
                lines = []
                if item is _STOP:
                    return
                item.set()
            self._write(lines)

    def _write(self, lines: list[str]) -> None:
        dropped = self._take_dropped()
        if dropped:
            lines.insert(0, _dropped_line(dropped))
        if not lines:
            return
        try:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass  # stderr is gone (closed pipe): nothing left to tell

    def close(self) -> None:
        """Write what is queued (bounded: a stream that never drains is given up after 5 s)."""
        if self._thread.is_alive() and self._offer_within(_STOP, 5.0):
            self._thread.join(timeout=5.0)
        dropped = self._take_dropped()
        if dropped and not self._thread.is_alive():
            self._write([])
        super().close()


def _dropped_line(count: int) -> str:
    return json.dumps(
        {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "level": "warning",
            "logger": __name__,
            "msg": f"{count} log lines dropped: stderr was not read fast enough",
            "dropped": count,
        }
    )


def say(text: str) -> None:
    """Print ``text`` on stderr after every log line queued before it (a refusal's one line is last)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _LineWriter):
            handler.flush()
    print(text, file=sys.stderr, flush=True)


def configure_logging(level: str = "info") -> None:
    handler = _LineWriter(sys.stderr)
    handler.setFormatter(JsonFormatter())
    atexit.register(handler.close)
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, _LineWriter):
            old.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
