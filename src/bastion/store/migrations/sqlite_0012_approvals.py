"""SQLite schema version 12: step-up approval requests (issue 27, ``store/approvals.py``).

One row per request; ``state`` moves from ``pending`` once. At most one live
request (pending, approved, denied) per ``(agent, execution_id)``: a partial
unique index, so two attempts of one execution never ask twice. ``approvers``
is a JSON array of approver names; ``arguments`` the call's arguments as JSON,
only when the grant shows them to the approver. Times are integer microseconds
since the UNIX epoch (UTC).
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE approvals (
        approval_id         TEXT PRIMARY KEY,
        agent               TEXT NOT NULL,
        agent_session_id    TEXT,
        human               TEXT,
        server              TEXT NOT NULL,
        tool                TEXT NOT NULL,
        binding             TEXT NOT NULL,
        execution_id        TEXT,
        call_id             TEXT NOT NULL,
        evidence_session_id TEXT,
        grant_name          TEXT NOT NULL,
        approvers           TEXT NOT NULL,
        arguments           TEXT,
        state               TEXT NOT NULL
            CHECK (state IN ('pending', 'approved', 'denied', 'timed_out', 'cancelled')),
        requested_at        INTEGER NOT NULL,
        expires_at          INTEGER NOT NULL,
        decided_at          INTEGER,
        decided_by          TEXT,
        note                TEXT
    )
    """,
    "CREATE INDEX approvals_by_time ON approvals (requested_at)",
    "CREATE UNIQUE INDEX approvals_live_execution ON approvals (agent, execution_id)"
    " WHERE execution_id IS NOT NULL AND state IN ('pending', 'approved', 'denied')",
)
