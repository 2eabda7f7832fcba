"""SQLite schema version 10: tasks and who owns them (issue 24).

A task an upstream created for a call through the gateway. ``task_id`` is the
gateway's own id, the only one a client ever sees (random, unguessable);
``upstream_task_id`` is the upstream's, never shown. The owner is ``agent`` and
``agent_session_id`` (``NULL`` for an agent authenticated by a static token);
``call_id``, ``evidence_session_id`` and ``execution_id`` name the call that
created it. One task per execution (a replay creates none), and one row per
upstream task of a server. Rows are never deleted; ``status`` only moves from
a live status (``working``, ``input_required``) to a terminal one
(``completed``, ``failed``, ``cancelled``), which is final. Times are integer
microseconds since the UNIX epoch (UTC).

Numbered 10 after the store-faults branch's version 9 (``store_owner``);
version 9 is reserved here until that branch is merged.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE tasks (
        task_id             TEXT PRIMARY KEY,
        agent               TEXT NOT NULL,
        agent_session_id    TEXT REFERENCES agent_sessions (agent_session_id),
        server              TEXT NOT NULL,
        upstream_task_id    TEXT NOT NULL,
        call_id             TEXT NOT NULL,
        evidence_session_id TEXT NOT NULL,
        execution_id        TEXT UNIQUE,
        status              TEXT NOT NULL
            CHECK (status IN ('working', 'input_required', 'completed', 'failed', 'cancelled')),
        created_at          INTEGER NOT NULL,
        updated_at          INTEGER NOT NULL,
        UNIQUE (server, upstream_task_id)
    )
    """,
    "CREATE INDEX tasks_by_owner ON tasks (agent, agent_session_id, created_at)",
)
