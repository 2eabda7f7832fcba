"""SQLite schema version 1: workers and generations, executions, audit chains, claims.

Times are integer microseconds since the UNIX epoch (UTC); JSON columns hold
UTF-8 JSON text.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE workers (
        worker_id     TEXT PRIMARY KEY,
        role          TEXT NOT NULL,
        provenance    TEXT NOT NULL,
        registered_at INTEGER NOT NULL,
        heartbeat_at  INTEGER NOT NULL,
        generation    TEXT
    )
    """,
    """
    CREATE TABLE generations (
        generation TEXT PRIMARY KEY,
        holder     TEXT NOT NULL REFERENCES workers (worker_id),
        epoch      INTEGER NOT NULL CHECK (epoch >= 1),
        claimed_at INTEGER NOT NULL
    )
    """,
    """
    CREATE TABLE executions (
        agent        TEXT NOT NULL,
        execution_id TEXT NOT NULL,
        binding      TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN
                         ('reserved', 'invoking', 'released', 'completed', 'failed', 'outcome_unknown')),
        call_id      TEXT,
        generation   TEXT NOT NULL,
        worker       TEXT NOT NULL,
        epoch        INTEGER NOT NULL,
        PRIMARY KEY (agent, execution_id)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE chains (
        session_id TEXT PRIMARY KEY,
        agent      TEXT,
        root       TEXT NOT NULL,
        head_seq   INTEGER NOT NULL,
        head_hash  TEXT NOT NULL,
        generation TEXT NOT NULL,
        closed     INTEGER NOT NULL DEFAULT 0 CHECK (closed IN (0, 1))
    )
    """,
    """
    CREATE TABLE entries (
        session_id TEXT NOT NULL REFERENCES chains (session_id),
        seq        INTEGER NOT NULL,
        prev       TEXT NOT NULL,
        hash       TEXT NOT NULL,
        entry      TEXT NOT NULL,
        worker     TEXT NOT NULL,
        epoch      INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE claims (
        session_id TEXT PRIMARY KEY REFERENCES chains (session_id),
        claim      TEXT NOT NULL
    )
    """,
)
