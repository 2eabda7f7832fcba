"""PostgreSQL schema version 2: rate-limit token buckets, as SQLite's version 5 has them."""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE TABLE token_buckets (
        bucket     TEXT COLLATE "C" PRIMARY KEY,
        tokens     DOUBLE PRECISION NOT NULL,
        updated_us BIGINT NOT NULL,
        full_at_us BIGINT NOT NULL
    )
    """,
    "CREATE INDEX token_buckets_full_at ON token_buckets (full_at_us)",
)
