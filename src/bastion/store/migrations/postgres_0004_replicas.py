"""PostgreSQL schema version 4: what makes replicas interchangeable, as SQLite's version 7 has it.

- ``transport_sessions``, ``changes`` and ``policy_reports``: the same columns
  and meanings as SQLite (``store/migrations/sqlite_0007_replicas.py``).
- ``changes.seq`` is handed out in commit order: a ``BEFORE INSERT`` trigger
  takes a transaction advisory lock before drawing the next value, so an
  insert waits for the previous inserter to commit. Followers read "changes
  after my cursor" and must never find a lower ``seq`` committing later.
  Changes are rare (revocations, terminations, forwarded cancels), so the
  serialization costs nothing that matters.
- An ``AFTER INSERT`` trigger sends ``NOTIFY bastion_changes`` with the new
  ``seq``, delivered at commit: listening replicas read the feed at once
  (``propagation/feed.py``); their poll remains the fallback.
- Revocations and terminations enter the feed by trigger, in the transaction
  that made them, as on SQLite.
"""

from __future__ import annotations

CHANNEL = "bastion_changes"

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE transport_sessions (
        key                 TEXT COLLATE "C" PRIMARY KEY,
        agent               TEXT COLLATE "C" NOT NULL,
        agent_session_id    TEXT COLLATE "C",
        credential_id       TEXT COLLATE "C",
        protocol_version    TEXT NOT NULL,
        client_capabilities TEXT NOT NULL,
        client_info         TEXT NOT NULL,
        created_at          BIGINT NOT NULL,
        last_seen_at        BIGINT NOT NULL,
        created_by          TEXT COLLATE "C" NOT NULL REFERENCES workers (worker_id),
        terminated_at       BIGINT,
        terminate_reason    TEXT,
        CHECK ((terminated_at IS NULL) = (terminate_reason IS NULL))
    )
    """,
    "CREATE INDEX transport_sessions_by_agent_session ON transport_sessions (agent_session_id)",
    """
    CREATE TABLE changes (
        seq     BIGINT PRIMARY KEY,
        kind    TEXT NOT NULL,
        subject TEXT COLLATE "C" NOT NULL,
        detail  TEXT,
        origin  TEXT COLLATE "C",
        at      BIGINT NOT NULL
    )
    """,
    "CREATE SEQUENCE changes_seq AS BIGINT OWNED BY changes.seq",
    """
    CREATE FUNCTION changes_in_commit_order() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('bastion.changes'));
        NEW.seq := nextval('changes_seq');
        RETURN NEW;
    END
    $$
    """,
    """
    CREATE TRIGGER changes_seq_in_commit_order BEFORE INSERT ON changes
    FOR EACH ROW EXECUTE FUNCTION changes_in_commit_order()
    """,
    f"""
    CREATE FUNCTION changes_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', NEW.seq::text);
        RETURN NULL;
    END
    $$
    """,
    "CREATE TRIGGER changes_notify AFTER INSERT ON changes FOR EACH ROW EXECUTE FUNCTION changes_notify()",
    """
    CREATE FUNCTION changes_on_revocation() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO changes (seq, kind, subject, detail, origin, at)
        VALUES (0, 'agent_session_revoked', NEW.agent_session_id, NULL, NULL, NEW.revoked_at);
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER changes_on_revocation AFTER UPDATE OF revoked_at ON agent_sessions
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION changes_on_revocation()
    """,
    """
    CREATE FUNCTION changes_on_termination() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO changes (seq, kind, subject, detail, origin, at)
        VALUES (0, 'transport_session_terminated', NEW.key,
                json_build_object('reason', NEW.terminate_reason)::text, NULL, NEW.terminated_at);
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER changes_on_termination AFTER UPDATE OF terminated_at ON transport_sessions
    FOR EACH ROW WHEN (OLD.terminated_at IS NULL AND NEW.terminated_at IS NOT NULL)
    EXECUTE FUNCTION changes_on_termination()
    """,
    """
    CREATE TABLE policy_reports (
        worker_id      TEXT COLLATE "C" PRIMARY KEY REFERENCES workers (worker_id),
        policy_version TEXT NOT NULL,
        reload_error   TEXT,
        reported_at    BIGINT NOT NULL
    )
    """,
)
