"""PostgreSQL schema version 9: a task's execution id is unique per agent, as SQLite's version 13 (issue 24).

Version 6 made ``execution_id`` unique over all rows; an execution id is scoped
under its agent (DESIGN section 3), so the constraint becomes
``UNIQUE (agent, execution_id)``.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = (
    "ALTER TABLE tasks DROP CONSTRAINT tasks_execution_id_key",
    "ALTER TABLE tasks ADD CONSTRAINT tasks_agent_execution_id_key UNIQUE (agent, execution_id)",
)
