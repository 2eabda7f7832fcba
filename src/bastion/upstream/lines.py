"""Splitting an upstream's byte stream into lines, never holding more than a bound (issue #13 hardening).

Owns: the one line splitter of the upstream side, used for stdio messages (one JSON-RPC
message a line, LF) and for SSE (CRLF, LF or CR). It searches only each new chunk for a
line end, so a long line costs linear time, and it holds at most ``max_line`` bytes of an
unfinished line (plus the chunk in hand): past that it raises :class:`LineOverLimit`, and
the caller stops reading and drops the connection. Line ends are ASCII, never part of a
UTF-8 character, so lines are split as bytes and decoded (if at all) by the caller.
Never does I/O itself.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator

import anyio.lowlevel

__all__ = ["ANY_LINE_END", "LF", "LineOverLimit", "split_lines"]

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


async def split_lines(
    chunks: AsyncIterator[bytes],
    *,
    max_line: int,
    ends: re.Pattern[bytes] = LF,
    checkpoint_per_chunk: bool = False,
) -> AsyncGenerator[bytes, None]:
    """Each line of ``chunks`` without its end; an unfinished last line is discarded.

    A CR at a chunk's end ends its line at once; an LF opening the next chunk is then the
    rest of that CRLF. ``checkpoint_per_chunk`` lets other tasks run between chunks.

    Raises:
        LineOverLimit: a line (finished or not) passed ``max_line`` bytes.
    """
    pending: list[bytes] = []  # the pieces of the unfinished line
    size = 0
    after_cr = False
    async for chunk in chunks:
        if not chunk:
            continue
        start = 1 if after_cr and chunk[0] == _LF else 0
        after_cr = False
        for match in ends.finditer(chunk, start):
            piece = chunk[start : match.start()]
            line = b"".join((*pending, piece)) if pending else piece
            if len(line) > max_line:
                raise LineOverLimit(max_line)
            pending, size = [], 0
            yield line
            start = match.end()
            after_cr = start == len(chunk) and chunk[start - 1] == 0x0D
        if start < len(chunk):
            pending.append(chunk[start:])
            size += len(chunk) - start
            if size > max_line:
                raise LineOverLimit(max_line)
        if checkpoint_per_chunk:
            await anyio.lowlevel.checkpoint()
