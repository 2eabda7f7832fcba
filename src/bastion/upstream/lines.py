"""Splitting an upstream's byte stream into lines, never holding more than a bound (issue #13 hardening).

Owns: the one line splitter of the upstream side, used for stdio messages (one JSON-RPC
message a line, LF) and for SSE (CRLF, LF or CR). It is fed chunk by chunk and holds at
most ``max_line`` bytes of an unfinished line (plus the chunk in hand): past that it raises
:class:`LineOverLimit`, and the caller stops reading and drops the connection. Each chunk
is split once (``re.split`` in C), so a long line costs linear time. Line ends are ASCII,
never part of a UTF-8 character, so lines are split as bytes and decoded (if at all) by
the caller. Synchronous and without I/O: the hot path pays no generator per line.
"""

from __future__ import annotations

import re

__all__ = ["ANY_LINE_END", "LF", "LineOverLimit", "LineSplitter"]

#: JSON-RPC over stdio: lines end at LF.
LF = re.compile(rb"\n")
#: Server-Sent Events: lines end at CRLF, LF or CR.
ANY_LINE_END = re.compile(rb"\r\n|\r|\n")

_LF = 0x0A


class LineOverLimit(Exception):
    """A line passed the bound; nothing more of it was read or kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"line over {limit} bytes")
        self.limit = limit


class LineSplitter:
    """Lines of a stream fed chunk by chunk, without their ends; an unfinished last line is never given."""

    def __init__(self, max_line: int, ends: re.Pattern[bytes] = LF) -> None:
        self.max_line = max_line
        self._ends = ends
        self._pending: list[bytes] = []  # the pieces of the unfinished line
        self._size = 0
        self._after_cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines this chunk finishes.

        A CR at a chunk's end ends its line at once; an LF opening the next chunk is then the
        rest of that CRLF.

        Raises:
            LineOverLimit: a line (finished or not) passed ``max_line`` bytes.
        """
        if not chunk:
            return []
        if self._after_cr and chunk[0] == _LF:
            chunk = chunk[1:]
        self._after_cr = chunk[-1:] == b"\r" and self._ends is not LF
        *lines, rest = self._ends.split(chunk)
        if lines and self._pending:
            lines[0] = b"".join((*self._pending, lines[0]))
            self._pending, self._size = [], 0
        # Only the first line holds earlier pieces; the others are no longer than the chunk.
        if lines and (
            len(lines[0]) > self.max_line
            or (len(chunk) > self.max_line and any(len(line) > self.max_line for line in lines))
        ):
            raise LineOverLimit(self.max_line)
        if rest:
            self._pending.append(rest)
            self._size += len(rest)
            if self._size > self.max_line:
                raise LineOverLimit(self.max_line)
        return lines
