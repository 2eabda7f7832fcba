"""Store operations written once, run by every engine: the statement protocol.

An operation of the store contract (a reservation, a chain append, a fence
check) is a generator: it yields :class:`Stmt` values and receives each one's
result, and returns the operation's result. It holds the whole logic (what to
read, what to refuse, what to write) and no I/O, so each engine drives the same
generator its own way: the SQLite engine on a worker thread inside its group
commit, the PostgreSQL engine with ``await`` inside one transaction per write.

SQL is written once, in the dialect both engines accept (``?`` placeholders,
integer times, ``0``/``1`` flags). What only one engine needs rides beside it:
``lock`` is the row-lock clause (``FOR UPDATE``, ``FOR KEY SHARE OF g``) that
PostgreSQL appends to a ``SELECT`` so concurrent transactions serialize where
the contract needs it; SQLite ignores it, having one writer at a time.

An operation may be run more than once (an engine retries a transaction that
lost a race), so it must do nothing but yield statements and compute.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, TypeAlias, TypeVar

__all__ = ["Fetch", "Op", "OpFactory", "Stmt", "count", "execute", "one", "rows"]

T = TypeVar("T")


class Fetch(enum.Enum):
    """What a statement's result is: one row (or ``None``), all rows, the changed-row count, nothing."""

    ONE = "one"
    ALL = "all"
    COUNT = "count"
    NONE = "none"


class Stmt(NamedTuple):
    """One statement of an operation (a tuple: a dozen are made per governed call)."""

    sql: str
    params: tuple[Any, ...]
    fetch: Fetch
    lock: str = ""


Op: TypeAlias = Generator[Stmt, Any, T]
"""An operation: yields statements, receives their results, returns its own."""

OpFactory: TypeAlias = Callable[[], Op[T]]
"""Makes a fresh run of one operation (an engine that retries calls it again)."""


def one(sql: str, *params: Any, lock: str = "") -> Op[tuple[Any, ...] | None]:
    """The first row of ``sql``, or ``None``."""
    row = yield Stmt(sql, params, Fetch.ONE, lock)
    return None if row is None else tuple(row)


def rows(sql: str, *params: Any, lock: str = "") -> Op[list[tuple[Any, ...]]]:
    """Every row of ``sql``."""
    found = yield Stmt(sql, params, Fetch.ALL, lock)
    return [tuple(row) for row in found]


def count(sql: str, *params: Any) -> Op[int]:
    """Run a write and return how many rows it changed."""
    changed = yield Stmt(sql, params, Fetch.COUNT)
    return int(changed)


def execute(sql: str, *params: Any) -> Op[None]:
    """Run a statement whose result nobody reads."""
    yield Stmt(sql, params, Fetch.NONE)
