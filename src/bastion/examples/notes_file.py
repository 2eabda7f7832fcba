"""The notes example's note file: JSON lines appended under ``flock``.

Both halves of the notes server read it: the tools (``notes_server.py``) and
the resources, prompts and completions (``notes_surface.py``). A demo fixture
for Bastion, not part of the gateway.
"""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass
from pathlib import Path

from bastion.examples.counter import default_path

__all__ = ["NOTES_FILE_ENV", "NoteFile"]

NOTES_FILE_ENV = "BASTION_NOTES_FILE"


@dataclass(frozen=True)
class NoteFile:
    """Notes as JSON lines, ``{"text": ...}`` each, appended under ``flock``."""

    path: Path

    @classmethod
    def from_environment(cls) -> NoteFile:
        """The file named by ``BASTION_NOTES_FILE``, or a per-user temp file."""
        return cls(default_path(NOTES_FILE_ENV, "bastion-example-notes.jsonl"))

    def add(self, text: str) -> int:
        """Append a note and return the number of notes including it. Raises ``OSError``."""
        line = json.dumps({"text": text}, ensure_ascii=False).encode() + b"\n"
        with self.path.open("a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.write(line)
                handle.flush()
                handle.seek(0)
                return sum(1 for _ in handle)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read(self) -> list[str]:
        """Every note's text, oldest first; empty when the file does not exist. Raises ``OSError``."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [str(json.loads(line)["text"]) for line in raw.splitlines() if line]
