"""What every evidence recorder of one gateway is built with: the claim profile, the TEE binding,
the policy in force, and the bounds from :class:`RuntimeOptions`.

Owns building :class:`EvidenceRecorder` objects (this worker's, the shared sessionless one, a
recovering peer's, a late write's) so each is built the same way; never records anything itself.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from bastion import __version__
from bastion.audit.claim import ClaimProfile, PolicyInForce
from bastion.audit.recorder import EvidenceRecorder
from bastion.audit.tee import ConfigfsTsm, no_attestation
from bastion.crypto.keys import Keyring
from bastion.policy.digest import snapshot_digest
from bastion.policy.reload import SnapshotHolder
from bastion.policy.snapshot import Snapshot
from bastion.replica.options import RuntimeOptions
from bastion.store.base import Store
from bastion.workers.membership import WorkerMembership

__all__ = ["EvidenceWiring", "build_digest"]

logger = logging.getLogger("bastion.gateway")


def build_digest() -> str:
    """``sha256:`` over the installed package's source files: the build these claims come from."""
    digest = hashlib.sha256(__version__.encode())
    root = resources.files("bastion")
    for path in sorted(Path(str(root)).rglob("*.py")):
        digest.update(path.relative_to(Path(str(root))).as_posix().encode())
        digest.update(path.read_bytes())
    return "sha256:" + digest.hexdigest()


class EvidenceWiring:
    """The profile, attestation and policy commitment of this gateway's claims."""

    def __init__(self, options: RuntimeOptions, policy: SnapshotHolder) -> None:
        self._options = options
        self._policy = policy
        self._policy_in_force: tuple[Snapshot, PolicyInForce] | None = None
        self._tsm = ConfigfsTsm(options.tsm_root)
        self._tsm_reason: str | None = None
        self.profile = ClaimProfile(
            trust_domain=options.trust_domain, issuer=options.issuer, build_digest=build_digest()
        )

    def check_tee(self) -> None:
        """At start: without configfs-tsm, evidence sessions record attestation ``none`` (warned)."""
        if not self._options.tsm_root.is_dir():
            self._tsm_reason = f"configfs-tsm is not available at {self._options.tsm_root}"
            logger.warning(
                "TEE binding unavailable; evidence sessions record attestation none",
                extra={
                    "reason": self._tsm_reason,
                },
            )

    def policy_in_force(self) -> PolicyInForce:
        """The snapshot in force, committed to by the digest of its compiled form (``policy/digest.py``)."""
        snapshot = self._policy.current
        if self._policy_in_force is None or self._policy_in_force[0] is not snapshot:
            digest = PolicyInForce(bundle_hash=snapshot_digest(snapshot), version=snapshot.version)
            self._policy_in_force = (snapshot, digest)
        return self._policy_in_force[1]

    def attest(self, chain_root: str) -> dict[str, Any]:
        if self._tsm_reason is not None:
            return no_attestation(self._tsm_reason)
        return self._tsm.bind_chain_root(chain_root)

    def recorder(
        self,
        store: Store,
        keyring: Keyring,
        membership: WorkerMembership,
        *,
        max_age_s: float | None = None,
        observe_write: Callable[[float], None] | None = None,
    ) -> EvidenceRecorder:
        """A recorder writing as ``membership``; ``max_age_s`` defaults to the options' evidence bound."""
        options = self._options
        return EvidenceRecorder(
            store,
            keyring,
            membership,
            attest=self.attest,
            profile=self.profile,
            policy=self.policy_in_force,
            max_entries=options.evidence_max_entries,
            max_age_s=options.evidence_max_age_s if max_age_s is None else max_age_s,
            observe_write=observe_write,
        )
