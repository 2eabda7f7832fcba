"""The log writer (bastion/logs.py): a stream that does not drain never blocks a log call."""

from __future__ import annotations

import io
import json
import logging
import threading

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


def test_a_full_queue_drops_and_counts_and_says_so_once_the_stream_drains() -> None:
    stream = _HeldStream()
    writer = _LineWriter(stream, capacity=3)
    writer.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.log_writer")
    logger.propagate = False
    logger.addHandler(writer)
    try:
        logger.warning("first")  # taken by the writer thread, which then waits on the stream
        assert stream.entered.wait(timeout=5)
        for n in range(10):
            logger.warning("line %d", n)  # returns at once although nothing can be written
        stream.release.set()
    finally:
        logger.removeHandler(writer)
        writer.close()
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
    writer = _LineWriter(stream)
    writer.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.log_writer.fields")
    logger.propagate = False
    logger.addHandler(writer)
    try:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("failed", extra={"server": "work"})
    finally:
        logger.removeHandler(writer)
        writer.close()
    (line,) = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["msg"] == "failed" and line["server"] == "work" and "RuntimeError: boom" in line["exc"]
