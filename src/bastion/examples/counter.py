"""A side-effect counter kept in a file, one line per invocation.

The example servers' ``increment`` tool appends one line to the file named by
``BASTION_COUNTER_FILE`` under an exclusive ``flock``, so the count survives a
restart of the server and a test can read it from outside the process: the
count is the number of lines. Exactly-once tests (DESIGN section 3) read it to
see how many times an upstream really ran a call.

This module never prints and never talks to a socket.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COUNTER_FILE_ENV", "FileCounter", "default_path"]

COUNTER_FILE_ENV = "BASTION_COUNTER_FILE"


def default_path(env_name: str, file_name: str) -> Path:
    """The path named by ``env_name``, else ``file_name`` in the temp directory, per user."""
    configured = os.environ.get(env_name)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"{file_name}.{os.getuid()}"


@dataclass(frozen=True)
class FileCounter:
    """A count that is the number of lines in ``path``."""

    path: Path

    @classmethod
    def from_environment(cls) -> FileCounter:
        """The counter named by ``BASTION_COUNTER_FILE``, or a per-user temp file."""
        return cls(default_path(COUNTER_FILE_ENV, "bastion-example-counter"))

    def increment(self) -> int:
        """Append one line and return the count including it. Raises ``OSError``."""
        with self.path.open("a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.write(b"1\n")
                handle.flush()
                os.fsync(handle.fileno())
                handle.seek(0)
                return sum(1 for _ in handle)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def count(self) -> int:
        """The number of lines so far; 0 when the file does not exist. Raises ``OSError``."""
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return 0
        with handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                return sum(1 for _ in handle)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
