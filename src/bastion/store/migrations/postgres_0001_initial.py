"""PostgreSQL schema version 1: the whole store as SQLite has it at its version 4.

The same tables, columns and meanings as the SQLite migrations 1 to 4, so
that one body of SQL (``store/ops/``) runs on both: times are integer
microseconds since the UNIX epoch (UTC, ``BIGINT``), JSON columns hold UTF-8
JSON text, ``closed`` is ``0``/``1``. Text compares bytewise (``COLLATE "C"``),
as in SQLite, so every ``ORDER BY`` gives one order on both engines.
``credentials.rowid`` keeps insertion order, as SQLite's implicit rowid does.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE workers (
        worker_id       TEXT COLLATE "C" PRIMARY KEY,
        role            TEXT NOT NULL,
        provenance      TEXT NOT NULL,
        registered_at   BIGINT NOT NULL,
        heartbeat_at    BIGINT NOT NULL,
        generation      TEXT COLLATE "C",
        claimed_epoch   BIGINT,
        withdrawn_at    BIGINT,
        withdraw_reason TEXT,
        failed_at       BIGINT,
        failure_reason  TEXT
    )
    """,
    """
    CREATE TABLE generations (
        generation TEXT COLLATE "C" PRIMARY KEY,
        holder     TEXT COLLATE "C" NOT NULL REFERENCES workers (worker_id),
        epoch      BIGINT NOT NULL CHECK (epoch >= 1),
        claimed_at BIGINT NOT NULL
    )
    """,
    """
    CREATE TABLE executions (
        agent        TEXT COLLATE "C" NOT NULL,
        execution_id TEXT COLLATE "C" NOT NULL,
        binding      TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN
                         ('reserved', 'invoking', 'released', 'completed', 'failed', 'outcome_unknown')),
        call_id      TEXT,
        generation   TEXT COLLATE "C" NOT NULL,
        worker       TEXT COLLATE "C" NOT NULL,
        epoch        BIGINT NOT NULL,
        PRIMARY KEY (agent, execution_id)
    )
    """,
    """
    CREATE INDEX executions_unsettled ON executions (generation, state)
        WHERE state IN ('reserved', 'invoking')
    """,
    """
    CREATE TABLE chains (
        session_id TEXT COLLATE "C" PRIMARY KEY,
        agent      TEXT COLLATE "C",
        root       TEXT NOT NULL,
        head_seq   BIGINT NOT NULL,
        head_hash  TEXT NOT NULL,
        generation TEXT COLLATE "C" NOT NULL,
        closed     SMALLINT NOT NULL DEFAULT 0 CHECK (closed IN (0, 1))
    )
    """,
    "CREATE INDEX chains_open ON chains (generation) WHERE closed = 0",
    """
    CREATE TABLE entries (
        session_id TEXT COLLATE "C" NOT NULL REFERENCES chains (session_id),
        seq        BIGINT NOT NULL,
        prev       TEXT NOT NULL,
        hash       TEXT NOT NULL,
        entry      TEXT NOT NULL,
        worker     TEXT COLLATE "C" NOT NULL,
        epoch      BIGINT NOT NULL,
        PRIMARY KEY (session_id, seq)
    )
    """,
    """
    CREATE TABLE claims (
        session_id TEXT COLLATE "C" PRIMARY KEY REFERENCES chains (session_id),
        claim      TEXT NOT NULL
    )
    """,
    """
    CREATE TABLE agent_sessions (
        agent_session_id TEXT COLLATE "C" PRIMARY KEY,
        human            TEXT NOT NULL,
        agent            TEXT COLLATE "C" NOT NULL,
        team             TEXT,
        scopes           TEXT NOT NULL,
        created_at       BIGINT NOT NULL,
        expires_at       BIGINT NOT NULL,
        revoked_at       BIGINT,
        revoked_by       TEXT,
        revoke_reason    TEXT,
        CHECK (expires_at > created_at),
        CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
    )
    """,
    "CREATE INDEX agent_sessions_by_agent ON agent_sessions (agent, created_at)",
    """
    CREATE TABLE credentials (
        rowid            BIGINT GENERATED ALWAYS AS IDENTITY,
        credential_id    TEXT COLLATE "C" PRIMARY KEY,
        agent_session_id TEXT COLLATE "C" NOT NULL REFERENCES agent_sessions (agent_session_id),
        kind             TEXT NOT NULL CHECK (kind IN ('bearer', 'mtls')),
        digest           TEXT COLLATE "C" NOT NULL,
        created_at       BIGINT NOT NULL,
        superseded_at    BIGINT,
        renewed_from     TEXT COLLATE "C" UNIQUE REFERENCES credentials (credential_id),
        UNIQUE (kind, digest)
    )
    """,
    "CREATE INDEX credentials_by_agent_session ON credentials (agent_session_id)",
    """
    CREATE TABLE attachments (
        worker_id             TEXT COLLATE "C" NOT NULL REFERENCES workers (worker_id),
        transport_session_ref TEXT COLLATE "C" NOT NULL,
        namespace             TEXT COLLATE "C" NOT NULL,
        attached_at           BIGINT NOT NULL,
        writer                TEXT COLLATE "C" NOT NULL REFERENCES workers (worker_id),
        epoch                 BIGINT NOT NULL,
        PRIMARY KEY (worker_id, transport_session_ref, namespace)
    )
    """,
    "CREATE INDEX attachments_by_session ON attachments (transport_session_ref)",
)
