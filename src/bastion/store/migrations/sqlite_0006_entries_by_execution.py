"""SQLite schema version 6: find every audit entry of one ``(agent, execution_id)`` (issue #11 point 11).

An execution's entries are spread over evidence sessions: its attempts, the
``outcome_unknown`` written by a recovering worker, entries written late after
storage recovered. ``bastion audit find`` and the replay refusal look them up
by two columns copied from the entry at insert (the entry's JSON, which the
hash rule covers, is unchanged).
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    "ALTER TABLE entries ADD COLUMN execution_id TEXT",
    "ALTER TABLE entries ADD COLUMN agent TEXT",
    """
    UPDATE entries SET execution_id = json_extract(entry, '$.execution_id'),
                       agent = json_extract(entry, '$.agent')
    """,
    """
    CREATE INDEX entries_by_execution ON entries (execution_id, agent)
        WHERE execution_id IS NOT NULL
    """,
)
