"""Which data directory a store belongs to, checked before a gateway serves from it (issue #23 point 1).

Two defects look like a first start and are not:

1. **A used data directory without its SQLite file.** The file was deleted or
   emptied (0 bytes) while ``keys/`` stayed: opening it would create an empty
   store, forget every execution, chain and claim, and let a completed
   ``execution_id`` run again. :func:`check_store_file` refuses it
   (:class:`StoreMissing`, naming the file) unless the operator asks for a new
   store explicitly (``bastion serve --discard-store-and-start-empty``); then
   the leftovers are removed and the start says so in its log.
2. **A store from another data directory.** :func:`claim_store` compares the
   signing keys recorded in the store (``store_owners``) with the keys this
   data directory holds (active and retired, ``keys/public/``). A SQLite store
   belongs to one data directory: a file whose recorded keys are none of this
   directory's is refused (:class:`StoreForeign`, naming the directory it came
   from). A PostgreSQL database is shared by replicas, each with its own data
   directory and key: it belongs to the set of their keys, so a replica's key
   joins the set at its first start and is never refused for being new. A
   store from before this record (no rows) is adopted by the first start.

Nothing here opens a store; the gateway calls these in its start-up order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from bastion.errors import StoreForeign, StoreMissing
from bastion.store.base import Store

__all__ = ["DISCARD_FLAG", "check_store_file", "claim_store", "data_dir_used"]

logger = logging.getLogger(__name__)

DISCARD_FLAG = "--discard-store-and-start-empty"
_SIDE_FILES = ("-wal", "-shm", "-journal")


def data_dir_used(data_dir: Path) -> bool:
    """Whether a gateway ran in ``data_dir`` before: its signing key exists (``crypto/keys.py``)."""
    return (data_dir / "keys" / "signing.pem").exists()


def check_store_file(store_file: Path, data_dir: Path, *, discard: bool) -> None:
    """Before the SQLite file is opened: refuse a missing or empty one in a used data directory.

    Raises:
        StoreMissing: ``store_file`` does not exist or has 0 bytes while ``data_dir`` was used,
            and ``discard`` was not asked for.
    """
    if not data_dir_used(data_dir):
        return
    try:
        size: int | None = store_file.stat().st_size
    except FileNotFoundError:
        size = None
    if size is not None and size > 0:
        return
    state = "missing" if size is None else "empty (0 bytes)"
    if not discard:
        raise StoreMissing(
            f"the store file {store_file} is {state}, but this data directory was used (its keys/ exist);"
            f" restore the file from a backup, or start with {DISCARD_FLAG} to begin an empty store",
            store_file=str(store_file),
        )
    for leftover in [store_file, *(store_file.with_name(store_file.name + s) for s in _SIDE_FILES)]:
        leftover.unlink(missing_ok=True)
    logger.warning(
        "store discarded: starting with an empty store (%s); the history of this data directory is gone",
        DISCARD_FLAG,
        extra={"store_file": str(store_file), "was": state},
    )


async def claim_store(
    store: Store,
    *,
    active_key: str,
    known_keys: Iterable[str],
    data_dir: Path,
    shared: bool,
    now: datetime,
) -> None:
    """Check that ``store`` belongs to this data directory, and record this directory's active key.

    ``shared``: several data directories use the store (PostgreSQL); it then belongs to
    their key set, and this directory's key joins it.

    Raises:
        StoreForeign: a store of one data directory (SQLite) whose recorded keys are none of
            ``known_keys``.
        StoreError: the store could not be read or written.
    """
    owners = await store.store_owners()
    known = set(known_keys) | {active_key}
    if owners and not shared and not any(owner.key_id in known for owner in owners):
        first = owners[0]
        raise StoreForeign(
            f"the store belongs to the data directory {first.data_dir} (signing key {first.key_id}),"
            f" not to {data_dir}: it was copied from there; put this directory's own store file back",
            store_data_dir=first.data_dir,
            store_key_id=first.key_id,
        )
    if active_key not in {owner.key_id for owner in owners}:
        await store.add_store_owner(active_key, str(data_dir), now=now)
