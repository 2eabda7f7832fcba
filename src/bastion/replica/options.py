"""Process-level settings of one gateway that are not policy (``bastion serve`` builds them).

Owns nothing else; re-exported by ``bastion.gateway``, where most importers find it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bastion.audit.tee import DEFAULT_TSM_REPORT_ROOT
from bastion.store.base import Store

__all__ = ["RuntimeOptions"]


@dataclass(frozen=True)
class RuntimeOptions:
    """Process-level settings that are not policy: where state lives and how this worker is fenced."""

    data_dir: Path
    # A PostgreSQL URL (``store/select.py``); ``None``: the SQLite file in ``data_dir``.
    store_url: str | None = None
    generation: str = "gateway-0"
    lease_s: float = 10.0
    heartbeat_s: float = 2.0
    evidence_max_entries: int = 10_000
    evidence_max_age_s: float = 3600.0
    # The age bound of the evidence sessions sessionless requests share (``audit/shared.py``).
    sessionless_evidence_max_age_s: float = 60.0
    trust_domain: str = "bastion.local"
    issuer: str = "https://bastion.local/"
    tsm_root: Path = DEFAULT_TSM_REPORT_ROOT
    refuse_when_store_degraded: bool = True
    # Benchmarks only: turns the audit chain off (`bastion serve --unsafe-no-audit`); warned at start.
    unsafe_no_audit: bool = False
    store_factory: Callable[[Store], Store] | None = None  # tests wrap the store (FaultyStore)
    # `bastion serve --discard-store-and-start-empty`: a used data directory's missing or empty
    # SQLite file starts a new, empty store instead of refusing the start (store/ownership.py).
    discard_store: bool = False
