"""SQLite schema version 7: what makes replicas interchangeable (DESIGN section 7, issue #10).

- ``transport_sessions``: front transport sessions as records, keyed by the
  SHA-256 of the ``Mcp-Session-Id`` (the id itself is never stored).
- ``changes``: the change feed, ordered by ``seq``. Two triggers put a
  revocation and a transport session's termination into it inside the
  transaction that made them, whoever wrote them (admin API, CLI, a replica).
- ``policy_reports``: the snapshot version each gateway worker runs.

Times are integer microseconds since the UNIX epoch (UTC).
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE transport_sessions (
        key                 TEXT PRIMARY KEY,
        agent               TEXT NOT NULL,
        agent_session_id    TEXT,
        credential_id       TEXT,
        protocol_version    TEXT NOT NULL,
        client_capabilities TEXT NOT NULL,
        client_info         TEXT NOT NULL,
        created_at          INTEGER NOT NULL,
        last_seen_at        INTEGER NOT NULL,
        created_by          TEXT NOT NULL REFERENCES workers (worker_id),
        terminated_at       INTEGER,
        terminate_reason    TEXT,
        CHECK ((terminated_at IS NULL) = (terminate_reason IS NULL))
    ) WITHOUT ROWID
    """,
    "CREATE INDEX transport_sessions_by_agent_session ON transport_sessions (agent_session_id)",
    """
    CREATE TABLE changes (
        seq     INTEGER PRIMARY KEY AUTOINCREMENT,
        kind    TEXT NOT NULL,
        subject TEXT NOT NULL,
        detail  TEXT,
        origin  TEXT,
        at      INTEGER NOT NULL
    )
    """,
    """
    CREATE TRIGGER changes_on_revocation AFTER UPDATE OF revoked_at ON agent_sessions
    WHEN OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL
    BEGIN
        INSERT INTO changes (kind, subject, detail, origin, at)
        VALUES ('agent_session_revoked', NEW.agent_session_id, NULL, NULL, NEW.revoked_at);
    END
    """,
    """
    CREATE TRIGGER changes_on_termination AFTER UPDATE OF terminated_at ON transport_sessions
    WHEN OLD.terminated_at IS NULL AND NEW.terminated_at IS NOT NULL
    BEGIN
        INSERT INTO changes (kind, subject, detail, origin, at)
        VALUES ('transport_session_terminated', NEW.key,
                json_object('reason', NEW.terminate_reason), NULL, NEW.terminated_at);
    END
    """,
    """
    CREATE TABLE policy_reports (
        worker_id      TEXT PRIMARY KEY REFERENCES workers (worker_id),
        policy_version TEXT NOT NULL,
        reload_error   TEXT,
        reported_at    INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
)
