"""SQLite schema version 5: find every audit entry of one ``(agent, execution_id)`` (issue #11 point 11).

An execution's entries are spread over evidence sessions: its attempts, the
``outcome_unknown`` written by a recovering worker, entries written late after
storage recovered. ``bastion audit find`` and the replay refusal look them up
by the entry's own fields, so the index is on the entry JSON itself: no new
column, nothing the hash rule sees.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE INDEX entries_by_execution
        ON entries (json_extract(entry, '$.execution_id'), json_extract(entry, '$.agent'))
        WHERE json_extract(entry, '$.execution_id') IS NOT NULL
    """,
)
