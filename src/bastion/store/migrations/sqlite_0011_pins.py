"""SQLite schema version 11: pinned definitions and the changes offered against them (issue 27).

One row per ``(server, kind, name)``: the pinned ``digest`` (SHA-256 hex of the
definition's RFC 8785 form) and ``definition`` (JSON text), when and by whom it
was pinned (``first_use`` or the approving operator), and at most one offer: a
changed definition the upstream showed, its digest, when, and its state
(``pending`` or ``rejected``), with the decision's time and operator. Times are
integer microseconds since the UNIX epoch (UTC).
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE pins (
        server             TEXT NOT NULL,
        kind               TEXT NOT NULL CHECK (kind IN ('tool', 'prompt', 'resource_template')),
        name               TEXT NOT NULL,
        digest             TEXT NOT NULL,
        definition         TEXT NOT NULL,
        pinned_at          INTEGER NOT NULL,
        pinned_by          TEXT NOT NULL,
        offered_digest     TEXT,
        offered_definition TEXT,
        offered_at         INTEGER,
        offer_state        TEXT CHECK (offer_state IN ('pending', 'rejected')),
        decided_at         INTEGER,
        decided_by         TEXT,
        PRIMARY KEY (server, kind, name)
    )
    """,
)
