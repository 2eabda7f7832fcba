"""SQLite schema version 9: which data directory and signing key the store file belongs to (issue #23).

One row per signing key that wrote this store, with the data directory it
lived in when it first did. A SQLite store belongs to exactly one data
directory: at start the gateway refuses a file whose row names a key this
data directory never held (a file copied from elsewhere). A file from before
this version has no row and is adopted by the first start that opens it.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE store_owners (
        key_id    TEXT PRIMARY KEY,
        data_dir  TEXT NOT NULL,
        joined_us INTEGER NOT NULL
    )
    """,
)
