"""SQLite schema version 8: audit entries in a rowid table, appended in write order (issue #13).

Version 1 kept ``entries`` ``WITHOUT ROWID``, clustered by ``(session_id, seq)``.
Rows are over a kilobyte (the entry's JSON), so each page held two or three,
and concurrent sessions inserting into the middle of one B-tree split pages
left half empty: a governed call wrote up to eight ``entries`` pages to the WAL
and the file grew twice as fast as its contents. Appended by rowid, the rows
fill pages in order; ``(session_id, seq)`` stays unique through the primary
key's index, whose small rows are cheap to insert anywhere. The rows are copied
as they are (same columns, same values), so every chain reads back unchanged.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE entries_appended (
        session_id   TEXT NOT NULL REFERENCES chains (session_id),
        seq          INTEGER NOT NULL,
        prev         TEXT NOT NULL,
        hash         TEXT NOT NULL,
        entry        TEXT NOT NULL,
        worker       TEXT NOT NULL,
        epoch        INTEGER NOT NULL,
        execution_id TEXT,
        agent        TEXT,
        PRIMARY KEY (session_id, seq)
    )
    """,
    """
    INSERT INTO entries_appended (session_id, seq, prev, hash, entry, worker, epoch, execution_id, agent)
    SELECT session_id, seq, prev, hash, entry, worker, epoch, execution_id, agent FROM entries
    ORDER BY session_id, seq
    """,
    "DROP TABLE entries",
    "ALTER TABLE entries_appended RENAME TO entries",
    "CREATE INDEX entries_by_execution ON entries (execution_id, agent)",
)
