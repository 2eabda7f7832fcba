"""SQLite schema version 2: indexes for recovery scans.

Recovery looks up a dead generation's unsettled executions and its open
chains; without these it reads every row ever written.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    """
    CREATE INDEX executions_unsettled ON executions (generation, state)
        WHERE state IN ('reserved', 'invoking')
    """,
    "CREATE INDEX chains_open ON chains (generation) WHERE closed = 0",
)
