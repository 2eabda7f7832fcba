"""The first steps of a gateway's start: open the store, check it is ours, open the signing key,
and recover what a dead predecessor of this generation left.

Raises :class:`ConfigError` or :class:`StoreError` (``store/ownership.py``, ``auth/roles.py``)
and never starts anything that runs on: the gateway composes the rest.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from bastion.audit.recorder import EvidenceRecorder
from bastion.auth.roles import check_store_roles
from bastion.crypto.keys import Keyring
from bastion.policy.snapshot import Snapshot
from bastion.replica.evidence_wiring import EvidenceWiring
from bastion.replica.options import RuntimeOptions
from bastion.store.base import Store
from bastion.store.ownership import check_store_file, claim_store
from bastion.store.select import SQLITE_FILE, open_store
from bastion.workers.membership import WorkerMembership
from bastion.workers.recovery import recover_generation

__all__ = ["claim_gateway_store", "open_gateway_store", "recover_own_generation", "warn_unsafe_options"]

logger = logging.getLogger("bastion.gateway")


async def open_gateway_store(options: RuntimeOptions) -> Store:
    """The store this gateway writes to (wrapped by ``options.store_factory`` in tests)."""
    options.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if options.store_url is None:  # issue #23: a used data directory never starts a fresh file
        check_store_file(options.data_dir / SQLITE_FILE, options.data_dir, discard=options.discard_store)
    store: Store = await open_store(options.store_url, options.data_dir)
    if options.store_factory is not None:
        store = options.store_factory(store)
    return store


async def claim_gateway_store(store: Store, options: RuntimeOptions, snapshot: Snapshot) -> Keyring:
    """Check the store's roles and ownership against this gateway's key; the opened keyring."""
    # One credential, one role: a configured token that is also a store credential is refused.
    await check_store_roles(snapshot, store)
    keyring = Keyring.open(options.data_dir)
    await claim_store(
        store,
        active_key=keyring.key_id,
        known_keys=(key.key_id for key in keyring.verifying_keys()),
        data_dir=options.data_dir,
        shared=options.store_url is not None,
        now=datetime.now(UTC),
    )
    return keyring


def warn_unsafe_options(options: RuntimeOptions) -> None:
    if options.unsafe_no_audit:
        logger.warning("UNSAFE: the audit chain is off (--unsafe-no-audit); nothing is recorded or claimed")


async def recover_own_generation(
    store: Store,
    recorder: EvidenceRecorder,
    membership: WorkerMembership,
    keyring: Keyring,
    evidence: EvidenceWiring,
    *,
    generation: str,
) -> None:
    """This gateway took its generation over: settle what the dead predecessor left."""
    changes, closed = await recover_generation(
        store,
        recorder,
        membership,
        keyring,
        profile=evidence.profile,
        policy=evidence.policy_in_force(),
    )
    logger.warning(
        "took over generation",
        extra={
            "generation": generation,
            "executions": len(changes),
            "chains_closed": len(closed),
        },
    )
