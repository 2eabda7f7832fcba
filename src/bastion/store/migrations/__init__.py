"""Numbered schema migrations of the store engines (DESIGN section 7).

Each engine has its own ordered tuple of :class:`Migration`; a file records
the version it has reached in ``schema_version``, and opening it with newer
code applies the missing steps in order, each set in one transaction. A
migration, once released, is never edited: a change is a new number. This
package holds schema text only; the engines run it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bastion.store.migrations import (
    postgres_0001_initial,
    postgres_0002_token_buckets,
    postgres_0003_entries_by_execution,
    postgres_0004_replicas,
    postgres_0005_store_owners,
    postgres_0006_tasks,
    postgres_0007_pins,
    postgres_0008_approvals,
    postgres_0009_tasks_per_agent,
    postgres_0010_task_tool,
    sqlite_0001_initial,
    sqlite_0002_recovery_indexes,
    sqlite_0003_agent_sessions,
    sqlite_0004_worker_registry,
    sqlite_0005_token_buckets,
    sqlite_0006_entries_by_execution,
    sqlite_0007_replicas,
    sqlite_0008_entries_appended,
    sqlite_0009_store_owner,
    sqlite_0010_tasks,
    sqlite_0011_pins,
    sqlite_0012_approvals,
    sqlite_0013_tasks_per_agent,
    sqlite_0014_task_tool,
)

__all__ = ["POSTGRES_MIGRATIONS", "SQLITE_MIGRATIONS", "Migration"]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


SQLITE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial", sqlite_0001_initial.STATEMENTS),
    Migration(2, "recovery_indexes", sqlite_0002_recovery_indexes.STATEMENTS),
    Migration(3, "agent_sessions", sqlite_0003_agent_sessions.STATEMENTS),
    Migration(4, "worker_registry", sqlite_0004_worker_registry.STATEMENTS),
    Migration(5, "token_buckets", sqlite_0005_token_buckets.STATEMENTS),
    Migration(6, "entries_by_execution", sqlite_0006_entries_by_execution.STATEMENTS),
    Migration(7, "replicas", sqlite_0007_replicas.STATEMENTS),
    Migration(8, "entries_appended", sqlite_0008_entries_appended.STATEMENTS),
    Migration(9, "store_owner", sqlite_0009_store_owner.STATEMENTS),
    Migration(10, "tasks", sqlite_0010_tasks.STATEMENTS),
    Migration(11, "pins", sqlite_0011_pins.STATEMENTS),
    Migration(12, "approvals", sqlite_0012_approvals.STATEMENTS),
    Migration(13, "tasks_per_agent", sqlite_0013_tasks_per_agent.STATEMENTS),
    Migration(14, "task_tool", sqlite_0014_task_tool.STATEMENTS),
)

POSTGRES_MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial", postgres_0001_initial.STATEMENTS),
    Migration(2, "token_buckets", postgres_0002_token_buckets.STATEMENTS),
    Migration(3, "entries_by_execution", postgres_0003_entries_by_execution.STATEMENTS),
    Migration(4, "replicas", postgres_0004_replicas.STATEMENTS),
    Migration(5, "store_owners", postgres_0005_store_owners.STATEMENTS),
    Migration(6, "tasks", postgres_0006_tasks.STATEMENTS),
    Migration(7, "pins", postgres_0007_pins.STATEMENTS),
    Migration(8, "approvals", postgres_0008_approvals.STATEMENTS),
    Migration(9, "tasks_per_agent", postgres_0009_tasks_per_agent.STATEMENTS),
    Migration(10, "task_tool", postgres_0010_task_tool.STATEMENTS),
)

# Each list is dense and ordered: migration n sits at index n - 1.
assert all(m.version == i + 1 for i, m in enumerate(SQLITE_MIGRATIONS))
assert all(m.version == i + 1 for i, m in enumerate(POSTGRES_MIGRATIONS))
