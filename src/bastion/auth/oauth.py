"""OAuth 2.1 resource server: JWT access tokens checked against the issuer's JWKS (DESIGN section 2 step 2).

Owns, as the MCP authorization spec asks of a resource server:

- :class:`OAuthVerifier`: ``Authorization: Bearer <JWT>`` to a
  :class:`~bastion.auth.principal.Principal`, checking signature (issuer's
  JWKS, algorithm allow-list), issuer, audience (this gateway's resource URL,
  RFC 8707), expiry, not-before and issued-at with a small leeway;
- :class:`JwksCache`: the issuer's keys, fetched over HTTP, cached, refreshed
  on an unknown ``kid`` at most once per ``min_refresh_interval_s`` (so a
  stream of forged ``kid`` values cannot make us fetch per request), and
  never used past ``max_age_s``: an unreachable JWKS refuses tokens;
- :func:`www_authenticate` (RFC 6750 section 3, RFC 9728 section 5.1),
  :func:`protected_resource_metadata` (RFC 9728 section 2) and
  :func:`resource_metadata_url` (RFC 9728 section 3.1);
- :func:`refuse_query_token`: tokens in the query string are refused (RFC 6750 section 2.3
  would allow them; OAuth 2.1 and the MCP spec do not).

Every refusal is :class:`~bastion.errors.Unauthenticated` (reason
``credential_invalid``); its ``cause`` says which check failed, for the audit.
A token is never logged, echoed in an error, or kept after the check; claim
values chosen by the token's issuer are not echoed either.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import anyio
import httpx
import jwt
import jwt.exceptions

from bastion.auth.principal import Principal
from bastion.errors import ConfigError, Unauthenticated
from bastion.ids import AgentId

__all__ = [
    "ClaimRules",
    "JwksCache",
    "OAuthSettings",
    "OAuthVerifier",
    "protected_resource_metadata",
    "refuse_query_token",
    "resource_metadata_url",
    "www_authenticate",
]

# Asymmetric algorithms only: HS* would let anyone holding the public key sign, and "none" signs nothing.
SUPPORTED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# Which key a JWS algorithm needs: (kty, crv or None).
_KEY_FOR_ALG: Mapping[str, tuple[str, str | None]] = {
    **{alg: ("RSA", None) for alg in ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")},
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", "Ed25519"),
}
_MAX_LEEWAY_S = 300.0
_MAX_JWKS_BYTES = 512 * 1024
_MAX_TOKEN_CHARS = 16 * 1024
# Query parameters that carry credentials (RFC 6750 section 2.3 and common variants).
_QUERY_CREDENTIAL_NAMES = frozenset({"access_token", "token", "bearer", "authorization", "id_token", "jwt"})
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
_CLAIM_TEXT = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")
# RFC 6750 section 3: what a quoted auth-param value may hold (no '"' and no '\').
_AUTH_PARAM_TEXT = re.compile(r"^[\x20\x21\x23-\x5b\x5d-\x7e]*$")
_BEARER_ERRORS = frozenset({"invalid_request", "invalid_token", "insufficient_scope"})


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class ClaimRules:
    """How verified claims become a :class:`Principal`. For each list, the first claim present wins.

    - agent: ``agent_claims`` (default ``client_id``, ``azp``, ``sub``), prefixed
      with ``agent_prefix`` so an issuer's clients cannot take the name of a
      configured agent (e.g. ``"oauth:"``);
    - human: ``human_claims`` (default ``email``); absent claims leave it ``None``;
    - team: ``team_claim`` (default none);
    - scopes: ``scope_claims`` (default ``scope`` as a space-separated string,
      ``scp`` as a string or an array of strings);
    - agent session: ``agent_session_claim`` (default none; e.g. ``sid``);
    - ``credential_id`` is the ``jti`` claim when present (never the token).

    A token without an agent claim, or with a claim of the wrong type, is refused.
    """

    agent_claims: tuple[str, ...] = ("client_id", "azp", "sub")
    agent_prefix: str = ""
    human_claims: tuple[str, ...] = ("email",)
    team_claim: str | None = None
    scope_claims: tuple[str, ...] = ("scope", "scp")
    agent_session_claim: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "agent_claims", tuple(self.agent_claims))
        object.__setattr__(self, "human_claims", tuple(self.human_claims))
        object.__setattr__(self, "scope_claims", tuple(self.scope_claims))
        if not self.agent_claims:
            raise ConfigError("auth.oauth.agent_claims must name at least one claim")
        names = [*self.agent_claims, *self.human_claims, *self.scope_claims]
        names += [n for n in (self.team_claim, self.agent_session_claim) if n is not None]
        if any(not isinstance(n, str) or not n for n in names):
            raise ConfigError(
                "auth.oauth: claim names (*_claims, team_claim, agent_session_claim) must be non-empty"
            )
        if self.agent_prefix and not _CLAIM_TEXT.match(self.agent_prefix):
            raise ConfigError("auth.oauth.agent_prefix must be printable text of at most 256 characters")

    def principal_from(self, claims: Mapping[str, Any]) -> Principal:
        """The principal these verified claims name.

        Raises:
            Unauthenticated: no agent claim, or a mapped claim of the wrong type.
        """
        agent = _first_text(claims, self.agent_claims, required=True)
        assert agent is not None
        human = _first_text(claims, self.human_claims, required=False)
        team = _first_text(claims, (self.team_claim,), required=False) if self.team_claim else None
        session = (
            _first_text(claims, (self.agent_session_claim,), required=False)
            if self.agent_session_claim
            else None
        )
        jti = _first_text(claims, ("jti",), required=False)
        try:
            expires_at = datetime.fromtimestamp(claims["exp"], tz=UTC)
        except (KeyError, TypeError, ValueError, OverflowError, OSError):
            raise Unauthenticated("Unauthorized: invalid access token", cause="bad_exp") from None
        return Principal(
            agent=AgentId(self.agent_prefix + agent),
            agent_session_id=session,
            human=human,
            team=team,
            scopes=_scopes(claims, self.scope_claims),
            credential_id=jti,
            expires_at=expires_at,
        )


@dataclass(frozen=True)
class OAuthSettings:
    """One trusted authorization server, and this gateway as its resource.

    ``audience`` is this gateway's resource URL (the MCP server URL clients
    use, e.g. ``https://gw.example.com/mcp``): a token for anything else is
    refused. ``jwks_url`` must be https, except on a loopback host.

    Raises:
        ConfigError: a missing URL, an algorithm outside the asymmetric allow-list, or bad bounds.
    """

    issuer: str
    audience: str
    jwks_url: str
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    leeway_s: float = 30.0
    jwks_min_refresh_interval_s: float = 30.0
    jwks_max_age_s: float = 600.0
    jwks_timeout_s: float = 5.0
    claims: ClaimRules = field(default_factory=ClaimRules)

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithms", tuple(self.algorithms))
        if not self.issuer:
            raise ConfigError("auth.oauth.issuer must not be empty")
        if not self.audience:
            raise ConfigError(
                "auth.oauth.audience must be this gateway's resource URL: set it, or auth.resource_url"
            )
        _check_jwks_url(self.jwks_url)
        if not self.algorithms:
            raise ConfigError("auth.oauth.algorithms must not be empty")
        for alg in self.algorithms:
            if alg not in SUPPORTED_ALGORITHMS:
                allowed = ", ".join(sorted(SUPPORTED_ALGORITHMS))
                raise ConfigError(f"auth.oauth.algorithms: {alg!r} is not allowed (allowed: {allowed})")
        if not 0 <= self.leeway_s <= _MAX_LEEWAY_S:
            raise ConfigError(f"auth.oauth.leeway_s must be between 0 and {_MAX_LEEWAY_S:g}")
        for name in ("jwks_min_refresh_interval_s", "jwks_max_age_s", "jwks_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"auth.oauth.{name} must be a positive number")
        if self.jwks_max_age_s < self.jwks_min_refresh_interval_s:
            raise ConfigError("auth.oauth.jwks_max_age_s must be at least jwks_min_refresh_interval_s")


def _check_jwks_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        raise ConfigError("auth.oauth.jwks_url is not a valid URL") from None
    if not host:
        raise ConfigError("auth.oauth.jwks_url has no host")
    # Keys fetched over plain HTTP could be swapped in transit: that is everyone's token.
    if parts.scheme != "https" and not (parts.scheme == "http" and host in _LOOPBACK):
        raise ConfigError("auth.oauth.jwks_url must be https (plain http only on a loopback host)")


# ---------------------------------------------------------------- keys


@dataclass(frozen=True)
class _VerificationKey:
    algorithms: frozenset[str]
    key: Any  # a cryptography public key object


class JwksCache:
    """The issuer's signing keys by ``kid``, fetched with the gateway's ``httpx`` client.

    - fetched on first use, and again once ``max_age_s`` has passed;
    - on an unknown ``kid``, refetched, but never twice within
      ``min_refresh_interval_s`` (fetches of any cause count);
    - concurrent lookups share one fetch;
    - a fetch that fails (unreachable, timeout, not 200, not a JWKS) keeps the
      keys held, but keys older than ``max_age_s`` are never used: tokens are
      then refused until a fetch succeeds.

    Only public signing keys are kept: entries without ``kid``, symmetric
    (``oct``) keys, keys with private parts, keys whose ``use`` is not ``sig``,
    and keys of unsupported types are ignored. ``monotonic`` is injectable for tests.
    """

    def __init__(
        self,
        url: str,
        http: httpx.AsyncClient,
        *,
        min_refresh_interval_s: float,
        max_age_s: float,
        timeout_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._http = http
        self._min_refresh_interval_s = min_refresh_interval_s
        self._max_age_s = max_age_s
        self._timeout_s = timeout_s
        self._monotonic = monotonic
        self._keys: dict[str, list[_VerificationKey]] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._lock = anyio.Lock()
        self.fetches = 0  # attempts, successful or not: for metrics and tests

    async def key_for(self, kid: str, alg: str) -> Any:
        """The public key with this ``kid`` that can verify ``alg``.

        Raises:
            Unauthenticated: no such key (after at most one permitted refresh), or no usable JWKS.
        """
        found = self._lookup(kid, alg)
        if found is not None:
            return found
        async with self._lock:
            # Another task may have refreshed while this one waited.
            found = self._lookup(kid, alg)
            if found is not None:
                return found
            now = self._monotonic()
            if self._attempted_at is None or now - self._attempted_at >= self._min_refresh_interval_s:
                await self._refresh(now)
                found = self._lookup(kid, alg)
                if found is not None:
                    return found
        if not self._fresh():
            raise Unauthenticated("Unauthorized: the token cannot be verified now", cause="jwks_unavailable")
        raise Unauthenticated("Unauthorized: invalid access token", cause="unknown_kid")

    def _fresh(self) -> bool:
        return self._fetched_at is not None and self._monotonic() - self._fetched_at < self._max_age_s

    def _lookup(self, kid: str, alg: str) -> Any:
        if not self._fresh():
            return None
        for candidate in self._keys.get(kid, ()):
            if alg in candidate.algorithms:
                return candidate.key
        return None

    async def _refresh(self, now: float) -> None:
        self._attempted_at = now
        self.fetches += 1
        try:
            with anyio.fail_after(self._timeout_s):
                keys = _parse_jwks(await self._fetch())
        except (TimeoutError, OSError, ValueError, httpx.HTTPError, httpx.StreamError):
            return  # keep what we hold; freshness decides whether it is still usable
        self._keys = keys
        self._fetched_at = self._monotonic()

    async def _fetch(self) -> Any:
        async with self._http.stream(
            "GET",
            self._url,
            headers={"Accept": "application/json, application/jwk-set+json"},
            timeout=self._timeout_s,
            follow_redirects=False,
        ) as response:
            if response.status_code != 200:
                raise ValueError(f"JWKS answered HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > _MAX_JWKS_BYTES:
                    raise ValueError("JWKS document too large")
        return json.loads(bytes(body))


def _parse_jwks(document: Any) -> dict[str, list[_VerificationKey]]:
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWK set")
    keys: dict[str, list[_VerificationKey]] = {}
    for entry in document["keys"]:
        parsed = _parse_jwk(entry)
        if parsed is not None:
            kid, key = parsed
            keys.setdefault(kid, []).append(key)
    return keys


def _parse_jwk(entry: Any) -> tuple[str, _VerificationKey] | None:
    if not isinstance(entry, dict):
        return None
    kid, kty, crv = entry.get("kid"), entry.get("kty"), entry.get("crv")
    if not isinstance(kid, str) or not kid or kty not in ("RSA", "EC", "OKP"):
        return None
    if "d" in entry or entry.get("use", "sig") != "sig":
        return None
    algorithms = {
        alg
        for alg, (need_kty, need_crv) in _KEY_FOR_ALG.items()
        if need_kty == kty and need_crv in (None, crv)
    }
    if "alg" in entry:
        # A key pinned to one algorithm verifies only that algorithm.
        algorithms &= {entry["alg"]}
    if not algorithms:
        return None
    try:
        key = jwt.PyJWK(entry, algorithm=min(algorithms)).key
    except (jwt.exceptions.PyJWTError, ValueError, TypeError):
        return None
    return kid, _VerificationKey(frozenset(algorithms), key)


# ---------------------------------------------------------------- verification


class OAuthVerifier:
    """Checks JWT access tokens from one authorization server and maps them to principals.

    ``http`` is the gateway's client (not owned: the gateway closes it).
    ``clock`` gives wall time for ``exp``/``nbf``/``iat``; ``monotonic`` paces
    JWKS refreshes. Both are injectable so tests never sleep.
    """

    def __init__(
        self,
        settings: OAuthSettings,
        http: httpx.AsyncClient,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self.jwks = JwksCache(
            settings.jwks_url,
            http,
            min_refresh_interval_s=settings.jwks_min_refresh_interval_s,
            max_age_s=settings.jwks_max_age_s,
            timeout_s=settings.jwks_timeout_s,
            monotonic=monotonic,
        )

    async def authenticate(self, authorization: str | None, query_string: bytes | str = b"") -> Principal:
        """The principal behind this request's ``Authorization`` header.

        Raises:
            Unauthenticated: a token in the query string, no bearer token, or a token that fails any check.
        """
        refuse_query_token(query_string)
        if not authorization:
            raise Unauthenticated(cause="no_credential")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("Unauthorized: use the Bearer scheme", cause="not_bearer")
        return await self.verify(token)

    async def verify(self, token: str) -> Principal:
        """Verify one JWT access token, numbered as RFC 9068 section 4 orders the checks.

        Raises:
            Unauthenticated: the token fails any check; ``cause`` names which.
        """
        settings = self._settings
        if len(token) > _MAX_TOKEN_CHARS:
            raise _invalid("too_large")
        # (1) A JWS in compact form, whose header names an allowed algorithm and a key id.
        try:
            header = jwt.get_unverified_header(token)
        except jwt.exceptions.PyJWTError:
            raise _invalid("malformed") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in settings.algorithms:
            raise _invalid("algorithm_not_allowed")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise _invalid("no_kid")
        # (2) The issuer's key for that kid and algorithm (JWKS, cached).
        key = await self.jwks.key_for(kid, alg)
        # (3) Signature, issuer and audience; the times are checked below against our clock.
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=[alg],
                audience=settings.audience,
                issuer=settings.issuer,
                options={
                    "require": ["exp", "iss", "aud"],
                    "verify_signature": True,
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": True,
                    "verify_iss": True,
                },
            )
        except jwt.exceptions.InvalidSignatureError:
            raise _invalid("bad_signature") from None
        except jwt.exceptions.InvalidAudienceError:
            raise _invalid("wrong_audience") from None
        except jwt.exceptions.InvalidIssuerError:
            raise _invalid("wrong_issuer") from None
        except jwt.exceptions.MissingRequiredClaimError:
            raise _invalid("missing_claim") from None
        except jwt.exceptions.PyJWTError:
            raise _invalid("malformed") from None
        # (4) Time: expired, not yet valid, or issued in the future (beyond the leeway).
        now = self._clock()
        leeway = settings.leeway_s
        exp = _numeric_date(claims, "exp")
        if exp is None:
            raise _invalid("missing_claim")
        if now >= exp + leeway:
            raise Unauthenticated("Unauthorized: access token expired", cause="expired")
        nbf = _numeric_date(claims, "nbf")
        if nbf is not None and now + leeway < nbf:
            raise Unauthenticated("Unauthorized: access token not yet valid", cause="not_yet_valid")
        iat = _numeric_date(claims, "iat")
        if iat is not None and now + leeway < iat:
            raise _invalid("issued_in_future")
        # (5) The principal the claims name.
        return settings.claims.principal_from(claims)


def _invalid(cause: str) -> Unauthenticated:
    return Unauthenticated("Unauthorized: invalid access token", cause=cause)


def _numeric_date(claims: Mapping[str, Any], name: str) -> float | None:
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _invalid(f"bad_{name}")
    return float(value)


def _first_text(claims: Mapping[str, Any], names: Sequence[str | None], *, required: bool) -> str | None:
    for name in names:
        if name is None or name not in claims:
            continue
        value = claims[name]
        if not isinstance(value, str) or not _CLAIM_TEXT.match(value):
            raise Unauthenticated("Unauthorized: invalid access token", cause=f"bad_claim_{name}")
        return value
    if required:
        raise Unauthenticated("Unauthorized: invalid access token", cause="no_agent_claim")
    return None


def _scopes(claims: Mapping[str, Any], names: Sequence[str]) -> frozenset[str]:
    scopes: set[str] = set()
    for name in names:
        if name not in claims:
            continue
        value = claims[name]
        if isinstance(value, str):
            scopes.update(value.split())
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            scopes.update(item for item in value if item)
        else:
            raise Unauthenticated("Unauthorized: invalid access token", cause=f"bad_claim_{name}")
    return frozenset(scopes)


# ---------------------------------------------------------------- the wire


def refuse_query_token(query_string: bytes | str) -> None:
    """Refuse a request whose query string carries a credential (``access_token=`` and kin).

    Raises:
        Unauthenticated: a credential-like parameter is present, whatever its case or encoding.
    """
    text = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
    if not text:
        return
    for name, _ in parse_qsl(text, keep_blank_values=True):
        if name.strip().lower() in _QUERY_CREDENTIAL_NAMES:
            raise Unauthenticated(
                "Unauthorized: credentials in the query string are refused", cause="token_in_query"
            )


def www_authenticate(
    resource_metadata_url: str,
    error: str | None = None,
    description: str | None = None,
    *,
    scope: str | None = None,
) -> str:
    """The ``WWW-Authenticate`` value of a 401 (or 403) answer.

    ``Bearer resource_metadata="…"`` (RFC 9728 section 5.1), then ``error``
    (``invalid_request``, ``invalid_token`` or ``insufficient_scope``),
    ``error_description`` and ``scope`` as RFC 6750 section 3 defines them.

    Raises:
        ValueError: an unknown error code, or a value RFC 6750 forbids in a quoted string.
    """
    params = [("resource_metadata", resource_metadata_url)]
    if error is not None:
        if error not in _BEARER_ERRORS:
            raise ValueError(f"unknown bearer error code {error!r}")
        params.append(("error", error))
    if description is not None:
        params.append(("error_description", description))
    if scope is not None:
        params.append(("scope", scope))
    for _, value in params:
        if not _AUTH_PARAM_TEXT.match(value):
            raise ValueError(
                "WWW-Authenticate values may not contain quotes, backslashes or control characters"
            )
    return "Bearer " + ", ".join(f'{name}="{value}"' for name, value in params)


def protected_resource_metadata(
    resource_url: str, authorization_servers: Sequence[str], scopes_supported: Sequence[str]
) -> dict[str, Any]:
    """The RFC 9728 document served at ``/.well-known/oauth-protected-resource``.

    Tokens are accepted only in the ``Authorization`` header (``bearer_methods_supported``).
    """
    if not authorization_servers:
        raise ValueError("at least one authorization server is required")
    return {
        "resource": resource_url,
        "authorization_servers": list(authorization_servers),
        "scopes_supported": list(scopes_supported),
        "bearer_methods_supported": ["header"],
    }


def resource_metadata_url(resource_url: str) -> str:
    """Where RFC 9728 section 3.1 puts the metadata of ``resource_url``.

    ``https://gw.example.com/mcp`` gives ``https://gw.example.com/.well-known/oauth-protected-resource/mcp``.
    """
    parts = urlsplit(resource_url)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-protected-resource" + path, "", ""))
