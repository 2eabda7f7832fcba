"""The log writer (bastion/logs.py): a stream that does not drain never blocks a log call."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
from collections.abc import Iterator

from bastion.logs import JsonFormatter, _LineWriter


class _HeldStream(io.StringIO):
    """A stream whose writes wait until ``release`` is set, as a pipe nobody reads does."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        assert self.release.wait(timeout=10), "the test never released the stream"
        return super().write(text)


@contextlib.contextmanager
def _logging_to(writer: _LineWriter, name: str) -> Iterator[logging.Logger]:
    """A logger of its own that writes through ``writer`` only; the writer is closed on the way out."""
    writer.setFormatter(JsonFormatter())
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.addHandler(writer)
    try:
        yield logger
    finally:
        logger.removeHandler(writer)
        writer.close()


def test_a_full_queue_drops_and_counts_and_says_so_once_the_stream_drains() -> None:
    stream = _HeldStream()
    with _logging_to(_LineWriter(stream, capacity=3), "test.log_writer") as logger:
        logger.warning("first")  # taken by the writer thread, which then waits on the stream
        assert stream.entered.wait(timeout=5)
        for n in range(10):
            logger.warning("line %d", n)  # returns at once although nothing can be written
        stream.release.set()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    messages = [line["msg"] for line in lines]
    # Three fit the queue, seven were dropped; the count is said before the next line written.
    assert messages == [
        "first",
        "7 log lines dropped: stderr was not read fast enough",
        "line 0",
        "line 1",
        "line 2",
    ]
    assert lines[1]["dropped"] == 7 and lines[1]["level"] == "warning"


def test_records_keep_their_fields_and_traceback() -> None:
    stream = io.StringIO()
    with _logging_to(_LineWriter(stream), "test.log_writer.fields") as logger:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("failed", extra={"server": "work"})
    (line,) = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["msg"] == "failed" and line["server"] == "work" and "RuntimeError: boom" in line["exc"]


class _CountingStream(_HeldStream):
    """A held stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_lines_queued_while_the_stream_was_busy_go_out_in_one_write_in_order() -> None:
    """A burst costs one write, not one per line (issue #28), and keeps its order."""
    stream = _CountingStream()
    writer = _LineWriter(stream)
    with _logging_to(writer, "test.log_writer.batch") as logger:
        logger.warning("first")
        assert stream.entered.wait(timeout=5)  # the writer holds "first" and waits on the stream
        for n in range(500):
            logger.warning("line %d", n)
        stream.release.set()
        writer.flush()
        assert stream.writes == 2  # "first", then the 500 queued behind it together
    messages = [json.loads(line)["msg"] for line in stream.getvalue().splitlines()]
    assert messages == ["first", *(f"line {n}" for n in range(500))]
