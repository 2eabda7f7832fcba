"""PostgreSQL schema version 5: the signing keys of the replicas that use this database (issue #23).

The same table as SQLite's version 9. Several replicas share one database,
each with its own data directory and signing key, so here the store belongs
to the key set of its replicas: each replica adds its key (and data
directory) when it first starts on the database, and a key is never refused
for being new. The rows say which data directories hold the keys that sign
this database's claims.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE store_owners (
        key_id    TEXT PRIMARY KEY,
        data_dir  TEXT NOT NULL,
        joined_us BIGINT NOT NULL
    )
    """,
)
