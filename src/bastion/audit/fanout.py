"""Walking one bundle file in several processes (DESIGN section 10: ``bastion verify`` >= 200,000 entries/s).

One process checks about 160,000 entries a second; the two cores of the
target machines together pass the target. :func:`walk_file` splits a large
file at line boundaries and forks one process per part, each running
``walk.walk_lines`` over its stretch and sending back what the stretch showed
(its first and last lines, session, genesis, attestation, close, matches); the
parent checks the seams (seq + 1, prev = hash, one session, nothing after a
close).

It only ever *accepts* that way. If any stretch fails or any seam does not
hold, the whole file is walked again in this process, so a defect is reported
exactly as the sequential walk reports it: the first bad line, its seq, its
defect. It forks only where that is safe (POSIX, no other thread in this
process) and worth it (several MiB); processes talk over pipes, never sockets.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from pathlib import Path
from typing import Any

import orjson

from bastion.audit.errors import VerificationError
from bastion.audit.walk import MAX_LINE, Stretch, read_lines, walk_lines

__all__ = ["walk_file"]

#: Below this a file is walked in one process: forking costs more than it saves.
_PARALLEL_MIN_BYTES = 8 << 20
_MAX_JOBS = 32


def walk_file(
    path: Path,
    *,
    source: str | None = None,
    execution_id: str | None = None,
    jobs: int = 1,
) -> Stretch:
    """:func:`walk_lines` over a file, split across up to ``jobs`` forked processes.

    Forks only where that is safe and worth it (POSIX, no other threads in
    this process, a file of several MiB); otherwise, and whenever a stretch or
    a seam fails, it walks the file in this process, so defects are reported
    exactly as the sequential walk reports them. ``OSError`` propagates.
    """
    jobs = min(jobs, _MAX_JOBS)
    if jobs > 1 and hasattr(os, "fork") and threading.active_count() == 1:
        size = os.path.getsize(path)
        if size >= _PARALLEL_MIN_BYTES:
            joined = _walk_forked(path, size, jobs, execution_id)
            if joined is not None:
                return joined
    with open(path, "rb") as handle:
        return walk_lines(read_lines(handle, source=source), source=source, execution_id=execution_id)


def _walk_forked(path: Path, size: int, jobs: int, execution_id: str | None) -> Stretch | None:
    """The stretches walked in parallel and joined, or ``None`` if anything is not clean."""
    bounds = _split(path, size, jobs)
    if bounds is None or len(bounds) < 3:
        return None
    children: list[tuple[int, int]] = []
    try:
        for start, end in itertools.pairwise(bounds[1:]):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child reports through the pipe, not to coverage
                os.close(read_end)
                _child(path, start, end, execution_id, write_end)
            os.close(write_end)
            children.append((pid, read_end))
        stretches: list[Stretch | None] = [_walk_range(path, bounds[0], bounds[1], execution_id, first=True)]
        for _, read_end in children:
            stretches.append(_decode(_read_all(read_end)))
    finally:
        for pid, read_end in children:
            with contextlib.suppress(OSError):
                os.close(read_end)
            os.waitpid(pid, 0)
    return _join(stretches)


def _split(path: Path, size: int, jobs: int) -> list[int] | None:
    """Byte offsets that start lines, splitting the file into about ``jobs`` parts."""
    bounds = [0]
    with open(path, "rb") as handle:
        for index in range(1, jobs):
            handle.seek(max(size * index // jobs, bounds[-1]))
            tail = handle.readline(MAX_LINE + 2)
            if tail and not tail.endswith(b"\n"):
                return None  # an overlong line or the end of the file: not worth splitting
            bounds.append(handle.tell())
    bounds.append(size)
    return sorted(set(bounds)) if bounds == sorted(bounds) else None


def _walk_range(path: Path, start: int, end: int, execution_id: str | None, *, first: bool) -> Stretch | None:
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            return walk_lines(
                read_lines(handle, limit=end - start), execution_id=execution_id, from_genesis=first
            )
    except VerificationError:
        return None


def _child(path: Path, start: int, end: int, execution_id: str | None, fd: int) -> None:  # pragma: no cover
    code = 0
    try:
        stretch = _walk_range(path, start, end, execution_id, first=False)
        payload = b"null" if stretch is None else orjson.dumps(_encode(stretch))
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(payload)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _encode(stretch: Stretch) -> dict[str, Any]:
    return {
        "count": stretch.count,
        "first_seq": stretch.first_seq,
        "first_prev": stretch.first_prev,
        "last": stretch.last,
        "session_id": stretch.session_id,
        "genesis": stretch.genesis,
        "attestation": stretch.attestation,
        "closed": stretch.closed,
        "matches": stretch.matches,
    }


def _decode(payload: bytes) -> Stretch | None:
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    return Stretch(
        count=data["count"],
        first_seq=data["first_seq"],
        first_prev=data["first_prev"],
        last=data["last"],
        session_id=data["session_id"],
        genesis=data["genesis"],
        attestation=data["attestation"],
        closed=data["closed"],
        matches=[(line, entry) for line, entry in data["matches"]],
    )


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _join(stretches: list[Stretch | None]) -> Stretch | None:
    """One stretch from consecutive clean ones whose seams hold; ``None`` otherwise."""
    first = stretches[0]
    if first is None or first.last is None or first.genesis is None:
        return None
    joined = Stretch(
        count=first.count,
        first_seq=first.first_seq,
        first_prev=first.first_prev,
        last=first.last,
        session_id=first.session_id,
        genesis=first.genesis,
        attestation=first.attestation,
        closed=first.closed,
        matches=list(first.matches),
    )
    for part in stretches[1:]:
        last = joined.last
        if (
            part is None
            or part.last is None
            or last is None
            or joined.closed
            or part.genesis is not None
            or part.first_seq != last["seq"] + 1
            or part.first_prev != last["hash"]
            or part.session_id != joined.session_id
            or (part.attestation is not None and joined.attestation is not None)
        ):
            return None
        joined.matches.extend((joined.count + line, entry) for line, entry in part.matches)
        joined.count += part.count
        joined.last, joined.closed = part.last, part.closed
        joined.attestation = joined.attestation or part.attestation
    # Line 2 is the attestation entry whenever there is a line 2; a seam must not hide its absence.
    if joined.count >= 2 and joined.attestation is None:
        return None
    return joined
