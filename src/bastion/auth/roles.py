"""One credential, one role: configured credentials never double as store credentials (issue #12).

The configuration holds the static agents', the admin's and the auditors'
token digests; the store holds agent-session credentials. A digest found on
both sides would let one secret act in two roles (and a static agent never
expires nor is revoked), so the gateway refuses it: at start, at every reload,
and when the admin API creates or renews a credential. Messages name key
paths and agent-session ids, never a digest.
"""

from __future__ import annotations

from bastion.errors import ConfigError
from bastion.policy.snapshot import Snapshot
from bastion.store.base import CredentialKind, Store

__all__ = ["check_store_roles"]


async def check_store_roles(snapshot: Snapshot, store: Store) -> None:
    """Refuse a configured credential that is also a credential in the store.

    Raises:
        ConfigError: names the configuration key and the agent session holding the same credential.
        StoreError: the store could not be read.
    """
    for digest, where in snapshot.credential_roles().items():
        for kind in CredentialKind:
            found = await store.find_credential(kind, digest)
            if found is not None:
                _, agent_session = found
                raise ConfigError(
                    f"{where}: the same credential as one of agent session "
                    f"{agent_session.agent_session_id} in the store; one credential, one role"
                )
