"""PostgreSQL schema version 6: tasks and who owns them, as SQLite's version 10 has it (issue 24).

Same columns and meanings as ``store/migrations/sqlite_0010_tasks.py``. Numbered
6 after the store-faults branch's version 5 (``store_owners``); version 5 is
reserved here until that branch is merged.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE tasks (
        task_id             TEXT COLLATE "C" PRIMARY KEY,
        agent               TEXT COLLATE "C" NOT NULL,
        agent_session_id    TEXT COLLATE "C" REFERENCES agent_sessions (agent_session_id),
        server              TEXT COLLATE "C" NOT NULL,
        upstream_task_id    TEXT COLLATE "C" NOT NULL,
        call_id             TEXT COLLATE "C" NOT NULL,
        evidence_session_id TEXT COLLATE "C" NOT NULL,
        execution_id        TEXT COLLATE "C" UNIQUE,
        status              TEXT NOT NULL
            CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
        created_at          BIGINT NOT NULL,
        updated_at          BIGINT NOT NULL,
        UNIQUE (server, upstream_task_id)
    )
    """,
    "CREATE INDEX tasks_by_owner ON tasks (agent, agent_session_id, created_at)",
)
