"""SQLite schema version 3: agent sessions and the credentials bound to them (DESIGN sections 1 and 8).

An agent session is the authorization context (human, agent, team, consented
scopes, expiry, revocation); a credential is an opaque bearer token (stored as
its SHA-256) or a client certificate (its SHA-256 fingerprint) bound to one
agent session. Rows are never deleted: revocation and renewal only fill in
``revoked_*`` and ``superseded_at``, so the record of who revoked what, and
which credential replaced which, stays. Times are integer microseconds since
the UNIX epoch (UTC); ``scopes`` is a sorted JSON array of strings.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE agent_sessions (
        agent_session_id TEXT PRIMARY KEY,
        human            TEXT NOT NULL,
        agent            TEXT NOT NULL,
        team             TEXT,
        scopes           TEXT NOT NULL,
        created_at       INTEGER NOT NULL,
        expires_at       INTEGER NOT NULL,
        revoked_at       INTEGER,
        revoked_by       TEXT,
        revoke_reason    TEXT,
        CHECK (expires_at > created_at),
        CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
    )
    """,
    "CREATE INDEX agent_sessions_by_agent ON agent_sessions (agent, created_at)",
    """
    CREATE TABLE credentials (
        credential_id    TEXT PRIMARY KEY,
        agent_session_id TEXT NOT NULL REFERENCES agent_sessions (agent_session_id),
        kind             TEXT NOT NULL CHECK (kind IN ('bearer', 'mtls')),
        digest           TEXT NOT NULL,
        created_at       INTEGER NOT NULL,
        superseded_at    INTEGER,
        renewed_from     TEXT UNIQUE REFERENCES credentials (credential_id),
        UNIQUE (kind, digest)
    )
    """,
    "CREATE INDEX credentials_by_agent_session ON credentials (agent_session_id)",
)
