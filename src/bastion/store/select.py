"""Which store a process opens: the SQLite file in its data directory, or a PostgreSQL database.

The location comes from, in order: ``--store`` on the command line, the
``BASTION_STORE`` environment variable, ``[store] url`` in the TOML
configuration; with none of them, the embedded SQLite file
``<data-dir>/bastion.db``. A location is a PostgreSQL URL
(``postgresql://user:password@host/db``); it is shown only through
:func:`~bastion.store.dsn.redact_dsn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bastion.errors import ConfigError
from bastion.store.base import Store
from bastion.store.dsn import is_postgres_url, redact_dsn

__all__ = ["SQLITE_FILE", "STORE_ENV", "choose_store_url", "describe_store", "open_store"]

STORE_ENV = "BASTION_STORE"
SQLITE_FILE = "bastion.db"


def choose_store_url(
    flag: str | None, environ: Mapping[str, str], configured: str | None = None
) -> str | None:
    """The PostgreSQL URL to use (flag, then environment, then configuration), or ``None`` for SQLite.

    Raises :class:`ConfigError` for a location that is not a PostgreSQL URL
    (the message never shows the location's password).
    """
    for source, value in (
        ("--store", flag),
        (STORE_ENV, environ.get(STORE_ENV)),
        ("[store] url", configured),
    ):
        if value:
            if not is_postgres_url(value):
                raise ConfigError(
                    f"{source}: expected a postgresql:// URL, got {redact_dsn(value)!r}"
                    " (leave it unset for the SQLite file in the data directory)"
                )
            return value
    return None


def describe_store(url: str | None, data_dir: Path) -> str:
    """What to log about the store: its engine and location, never a password."""
    return f"sqlite {data_dir / SQLITE_FILE}" if url is None else f"postgresql {redact_dsn(url)}"


async def open_store(url: str | None, data_dir: Path) -> Store:
    """Open (creating and migrating if needed) the store at ``url``, or the SQLite file under ``data_dir``."""
    if url is None:
        from bastion.store.sqlite import SqliteStore

        return await SqliteStore.open(data_dir / SQLITE_FILE)
    from bastion.store.postgres import PostgresStore

    return await PostgresStore.connect(url)
