"""SQLite schema version 13: a task's execution id is unique per agent, not across agents (issue 24).

Version 10 made ``execution_id`` unique over all rows, but an execution id is
scoped under its agent (DESIGN section 3: the same value under another agent is
another key): two agents using one value could not both create a task. SQLite
cannot drop a column constraint, so the table is made again with
``UNIQUE (agent, execution_id)`` and its rows copied unchanged.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE tasks_v11 (
        task_id             TEXT PRIMARY KEY,
        agent               TEXT NOT NULL,
        agent_session_id    TEXT REFERENCES agent_sessions (agent_session_id),
        server              TEXT NOT NULL,
        upstream_task_id    TEXT NOT NULL,
        call_id             TEXT NOT NULL,
        evidence_session_id TEXT NOT NULL,
        execution_id        TEXT,
        status              TEXT NOT NULL
            CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
        created_at          INTEGER NOT NULL,
        updated_at          INTEGER NOT NULL,
        UNIQUE (server, upstream_task_id),
        UNIQUE (agent, execution_id)
    )
    """,
    "INSERT INTO tasks_v11 SELECT task_id, agent, agent_session_id, server, upstream_task_id, call_id,"
    " evidence_session_id, execution_id, status, created_at, updated_at FROM tasks",
    "DROP TABLE tasks",
    "ALTER TABLE tasks_v11 RENAME TO tasks",
    "CREATE INDEX tasks_by_owner ON tasks (agent, agent_session_id, created_at)",
)
