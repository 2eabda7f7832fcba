"""PostgreSQL schema version 8: step-up approval requests, as SQLite's version 12 has them (issue 27).

Same columns and meanings as ``store/migrations/sqlite_0012_approvals.py``.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE approvals (
        approval_id         TEXT COLLATE "C" PRIMARY KEY,
        agent               TEXT COLLATE "C" NOT NULL,
        agent_session_id    TEXT COLLATE "C",
        human               TEXT,
        server              TEXT COLLATE "C" NOT NULL,
        tool                TEXT COLLATE "C" NOT NULL,
        binding             TEXT COLLATE "C" NOT NULL,
        execution_id        TEXT COLLATE "C",
        call_id             TEXT COLLATE "C" NOT NULL,
        evidence_session_id TEXT COLLATE "C",
        grant_name          TEXT COLLATE "C" NOT NULL,
        approvers           TEXT NOT NULL,
        arguments           TEXT,
        state               TEXT NOT NULL
            CHECK (state IN ('pending', 'approved', 'denied', 'timed_out', 'cancelled')),
        requested_at        BIGINT NOT NULL,
        expires_at          BIGINT NOT NULL,
        decided_at          BIGINT,
        decided_by          TEXT,
        note                TEXT
    )
    """,
    "CREATE INDEX approvals_by_time ON approvals (requested_at)",
    "CREATE UNIQUE INDEX approvals_live_execution ON approvals (agent, execution_id)"
    " WHERE execution_id IS NOT NULL AND state IN ('pending', 'approved', 'denied')",
)
