"""Writing evidence for offline verification: audit bundles and claims (DESIGN section 4).

A **bundle** is JSON Lines: one sealed :class:`AuditEntry` per line, in chain
order, each line exactly the RFC 8785 canonical JSON of the entry's every
field (``hash`` included) followed by ``\\n``. A **claim file** is the RFC 8785
canonical JSON of the signed claim followed by ``\\n``. Both forms are exact,
so ``verify.py`` can refuse any other spelling: a changed byte never goes
unnoticed, not even in whitespace.

A bundle validates as it is written (seq continuity and ``prev`` links), so a
broken chain is refused here rather than exported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from bastion.audit.entry import GENESIS_PREV, AuditEntry
from bastion.crypto.jcs import canonical_json

__all__ = ["claim_bytes", "entry_line", "write_bundle", "write_bundle_file", "write_claim_file"]


def entry_line(entry: AuditEntry) -> bytes:
    """One bundle line: the RFC 8785 bytes of every field of ``entry``, then ``\\n``.

    Raises ``ValueError`` for an unsealed entry.
    """
    if entry.hash is None:
        raise ValueError(f"entry seq {entry.seq} is not sealed")
    return canonical_json(entry.to_json()) + b"\n"


def write_bundle(entries: Iterable[AuditEntry], out: BinaryIO) -> int:
    """Write ``entries`` as a bundle to ``out``; returns how many were written.

    Raises ``ValueError`` if the entries are not one chain from its genesis:
    seq 0 first with ``prev`` = 64 zeros, then ``seq + 1`` and ``prev`` = the
    previous hash. Nothing is written past the first bad entry.
    """
    expected_seq, expected_prev, count = 0, GENESIS_PREV, 0
    for entry in entries:
        if entry.seq != expected_seq or entry.prev != expected_prev:
            raise ValueError(f"entry seq {entry.seq} does not continue the chain at seq {expected_seq}")
        if entry.hash is None:
            raise ValueError(f"entry seq {entry.seq} is not sealed")
        out.write(entry_line(entry))
        expected_seq, expected_prev = entry.seq + 1, entry.hash
        count += 1
    return count


def write_bundle_file(entries: Iterable[AuditEntry], path: Path) -> int:
    """:func:`write_bundle` to a new file at ``path`` (refuses to overwrite one)."""
    with open(path, "xb") as out:
        return write_bundle(entries, out)


def claim_bytes(claim: Mapping[str, Any]) -> bytes:
    """A claim file's exact bytes: the RFC 8785 form of the signed claim, then ``\\n``."""
    if "signature" not in claim:
        raise ValueError("claim is not signed")
    return canonical_json(dict(claim)) + b"\n"


def write_claim_file(claim: Mapping[str, Any], path: Path) -> None:
    """Write :func:`claim_bytes` to a new file at ``path`` (refuses to overwrite one)."""
    with open(path, "xb") as out:
        out.write(claim_bytes(claim))
