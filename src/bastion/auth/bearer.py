"""Static bearer tokens from the configuration snapshot (DESIGN section 2 step 2).

Owns: turning an ``Authorization: Bearer`` header into an agent, comparing
only SHA-256 digests (the configuration never holds a token). A token in the
query string is refused outright: URLs end up in logs. The token itself never
appears in an error, a log line or the audit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from bastion.errors import Unauthenticated
from bastion.ids import AgentId
from bastion.policy.snapshot import Snapshot

__all__ = ["StaticBearerAuth", "hash_token"]

_QUERY_TOKEN_KEYS = (b"access_token=", b"token=", b"bearer=")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class StaticBearerAuth:
    """Agents known by the SHA-256 of their bearer token."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._by_hash: Mapping[str, AgentId] = {
            a.token_sha256: a.name for a in snapshot.agents if a.token_sha256 is not None
        }
        # The agent a request without credentials is, if the configuration names one.
        self.anonymous_agent: AgentId | None = next((a.name for a in snapshot.agents if a.anonymous), None)

    def authenticate(self, authorization: str | None, query_string: bytes = b"") -> AgentId:
        """The agent behind this request.

        Raises:
            Unauthenticated: no credential, a malformed one, an unknown one, or one in the query string.
        """
        lowered = query_string.lower()
        if any(lowered.startswith(k) or b"&" + k in lowered for k in _QUERY_TOKEN_KEYS):
            raise Unauthenticated("Unauthorized: credentials in the query string are refused")
        if not authorization:
            raise Unauthenticated()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("Unauthorized: use the Bearer scheme")
        # Lookup by the digest of a high-entropy secret: timing reveals nothing about the token.
        agent = self._by_hash.get(hash_token(token))
        if agent is None:
            raise Unauthenticated("Unauthorized: unknown credential")
        return agent
