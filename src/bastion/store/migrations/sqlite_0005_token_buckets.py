"""SQLite schema version 5: rate-limit token buckets shared by replicas (``store/token_buckets.py``).

``bucket`` is an opaque key (a digest of grant, rate, agent, server and tool);
``tokens`` the level as of ``updated_us``; ``full_at_us`` when it is full
again, so that full buckets can be forgotten. Times are integer microseconds
since the UNIX epoch (UTC).
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE token_buckets (
        bucket     TEXT PRIMARY KEY,
        tokens     REAL NOT NULL,
        updated_us INTEGER NOT NULL,
        full_at_us INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
    "CREATE INDEX token_buckets_full_at ON token_buckets (full_at_us)",
)
