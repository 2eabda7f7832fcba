"""Worker identities: ``<name>-<UTC timestamp>-<short sha>`` (DESIGN section 1, seed 004).

Collision-resistant by construction (a timestamp plus 48 random bits hashed
with the pid and host); a collision is still refused by the store, never
merged, and the caller mints another.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from datetime import UTC, datetime

from bastion.ids import WorkerId

__all__ = ["WORKER_ID_RULE", "mint_worker_id"]

WORKER_ID_RULE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}-[0-9]{8}T[0-9]{6}Z-[0-9a-f]{12}$")


def mint_worker_id(name: str, *, now: datetime | None = None) -> WorkerId:
    """A fresh identity for a worker called ``name`` (lowercase letters, digits, dashes)."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    seed = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}".encode()
    short = hashlib.sha256(seed).hexdigest()[:12]
    worker_id = f"{name}-{moment.strftime('%Y%m%dT%H%M%SZ')}-{short}"
    if not WORKER_ID_RULE.match(worker_id):
        raise ValueError(f"worker name {name!r} must be lowercase letters, digits and dashes")
    return WorkerId(worker_id)
