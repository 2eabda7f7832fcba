"""PostgreSQL schema version 3: find every audit entry of one ``(agent, execution_id)``, as SQLite's 6."""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    'ALTER TABLE entries ADD COLUMN execution_id TEXT COLLATE "C"',
    'ALTER TABLE entries ADD COLUMN agent TEXT COLLATE "C"',
    """
    UPDATE entries SET execution_id = entry::jsonb ->> 'execution_id',
                       agent = entry::jsonb ->> 'agent'
    """,
    """
    CREATE INDEX entries_by_execution ON entries (execution_id, agent)
        WHERE execution_id IS NOT NULL
    """,
)
