"""SQLite schema version 4: the worker registry's own facts (DESIGN section 6, issue #5).

- ``workers.claimed_epoch``: the epoch a worker's last claim returned, so a
  superseded worker still shows which epoch it held.
- ``workers.withdrawn_at`` / ``withdraw_reason``: liveness withdrawn at once
  (the worker's PID is known dead on its host). A withdrawn record never counts
  as live again, whatever its heartbeat says.
- ``workers.failed_at`` / ``failure_reason``: a failure scoped to this one
  identity (an upstream runtime that died), never to its namespace or fleet.
- ``attachments``: session ownership, kept apart from launch provenance
  (``workers.provenance``): which client transport session uses a worker for a
  namespace now. A row is written under its writer's ``(worker, epoch)`` and
  deleted when cleared; it proves ownership only while that writer still holds
  its claim. ``transport_session_ref`` is an opaque reference, never the
  ``Mcp-Session-Id`` itself.

Times are integer microseconds since the UNIX epoch (UTC).
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    "ALTER TABLE workers ADD COLUMN claimed_epoch INTEGER",
    "ALTER TABLE workers ADD COLUMN withdrawn_at INTEGER",
    "ALTER TABLE workers ADD COLUMN withdraw_reason TEXT",
    "ALTER TABLE workers ADD COLUMN failed_at INTEGER",
    "ALTER TABLE workers ADD COLUMN failure_reason TEXT",
    # Claims made before this version: the holder's epoch is the generation's.
    "UPDATE workers SET claimed_epoch = (SELECT g.epoch FROM generations AS g"
    " WHERE g.holder = workers.worker_id) WHERE generation IS NOT NULL",
    """
    CREATE TABLE attachments (
        worker_id             TEXT NOT NULL REFERENCES workers (worker_id),
        transport_session_ref TEXT NOT NULL,
        namespace             TEXT NOT NULL,
        attached_at           INTEGER NOT NULL,
        writer                TEXT NOT NULL REFERENCES workers (worker_id),
        epoch                 INTEGER NOT NULL,
        PRIMARY KEY (worker_id, transport_session_ref, namespace)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX attachments_by_session ON attachments (transport_session_ref)",
)
