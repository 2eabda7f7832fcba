"""PostgreSQL schema version 7: pinned definitions, as SQLite's version 11 has them (issue 27).

Same columns and meanings as ``store/migrations/sqlite_0011_pins.py``.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE pins (
        server             TEXT COLLATE "C" NOT NULL,
        kind               TEXT COLLATE "C" NOT NULL CHECK (kind IN ('tool', 'prompt', 'resource_template')),
        name               TEXT COLLATE "C" NOT NULL,
        digest             TEXT NOT NULL,
        definition         TEXT NOT NULL,
        pinned_at          BIGINT NOT NULL,
        pinned_by          TEXT NOT NULL,
        offered_digest     TEXT,
        offered_definition TEXT,
        offered_at         BIGINT,
        offer_state        TEXT CHECK (offer_state IN ('pending', 'rejected')),
        decided_at         BIGINT,
        decided_by         TEXT,
        PRIMARY KEY (server, kind, name)
    )
    """,
)
