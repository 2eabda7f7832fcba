"""Who is calling: every credential kind resolved to one :class:`Principal` (DESIGN section 2 step 2).

Order, first match wins, and a miss at one kind is never a grant at another
(no ``Authorization`` header at all is the configured anonymous agent, if any):

1. a credential in the query string is refused outright (URLs end up in logs);
2. a bearer token shaped like a JWT goes to the OAuth resource server, when one is configured;
3. a static agent token from the configuration;
4. an opaque credential bound to an agent session in the store (expiry and
   revocation checked on every request, so a transport session never outlives
   its agent session).

The token never appears in an error, a log line or the audit.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from bastion.auth.agent_session import StoreBearerAuth
from bastion.auth.bearer import StaticBearerAuth
from bastion.auth.oauth import OAuthVerifier, refuse_query_token
from bastion.auth.principal import Principal
from bastion.errors import Unauthenticated

__all__ = ["Authenticator"]


def _looks_like_jwt(token: str) -> bool:
    parts = token.split(".")
    return len(parts) == 3 and all(parts)


class Authenticator:
    """Resolves a request's credential to a principal, or raises the typed refusal."""

    def __init__(
        self,
        static: Callable[[], StaticBearerAuth],
        store_auth: StoreBearerAuth | None,
        oauth: OAuthVerifier | None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._static = static
        self._store_auth = store_auth
        self._oauth = oauth
        self._clock = clock

    async def authenticate(self, authorization: str | None, query_string: bytes) -> Principal:
        """The principal behind this request.

        Raises:
            Unauthenticated: missing, malformed, unknown or superseded credential, or one in the query string.
            AgentSessionExpired, AgentSessionRevoked: the credential's agent session no longer holds.
        """
        refuse_query_token(query_string)
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if not authorization:
            # (0) No credential at all: the configured anonymous agent (loopback binds only,
            # checked by `auth/anonymous.py` at serve), else refused. A wrong credential is
            # never downgraded to anonymous.
            anonymous = self._static().anonymous_agent
            if anonymous is not None:
                return Principal(agent=anonymous, credential_id=f"anonymous:{anonymous}")
            raise Unauthenticated(cause="missing")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("Unauthorized: use the Bearer scheme", cause="scheme")
        if self._oauth is not None and _looks_like_jwt(token):
            return await self._oauth.authenticate(authorization, query_string)
        try:
            agent = self._static().authenticate(authorization, query_string)
            return Principal(agent=agent, credential_id=f"static:{agent}")
        except Unauthenticated:
            if self._store_auth is None:
                raise
        return await self._store_auth.authenticate(authorization, query_string, self._clock())
