"""Credentials bound to agent sessions in the store (DESIGN sections 1, 2 steps 2 and 3, 8).

Owns: turning an opaque bearer token or a client-certificate fingerprint into
a :class:`Principal`, through the store's credential table, and the one check
of an agent session (:func:`check_agent_session`) that every governed call
repeats. Tokens are looked up by their SHA-256 only; the token itself never
appears in an error, a log line or the audit, and this module logs nothing.

Mutual TLS: how a deployment passes the client certificate
-----------------------------------------------------------
``bastion serve`` runs on uvicorn, which verifies client certificates when
configured with ``ssl_cert_reqs`` but does not hand the certificate to the
application. So the supported deployment terminates TLS at a proxy (Envoy,
nginx, HAProxy) that verifies the client certificate and forwards its
SHA-256 fingerprint (hex, colons allowed) in a header that the gateway is
told to trust, from proxy addresses it is told to trust:
:func:`client_certificate_fingerprint` with ``trusted_header`` and
``trusted_proxies``. The proxy must overwrite that header on every request.
A server that implements the ASGI TLS extension (``scope["extensions"]["tls"]
["client_cert_chain"]``) is read directly instead. By default neither is
configured and no request has a certificate: fail closed. The header from a
peer that is not a trusted proxy is refused, not ignored: it is a forgery.
"""

from __future__ import annotations

import hashlib
import re
import ssl
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from bastion.auth.principal import Principal
from bastion.errors import AgentSessionExpired, AgentSessionRevoked, Unauthenticated
from bastion.store.base import AgentSessionRecord, CredentialKind, CredentialRecord, Store

__all__ = [
    "StoreBearerAuth",
    "check_agent_session",
    "client_certificate_fingerprint",
    "normalize_fingerprint",
    "principal_for",
    "token_digest",
]

_QUERY_TOKEN_KEYS = (b"access_token=", b"token=", b"bearer=")
_FINGERPRINT_RULE = re.compile(r"[0-9a-f]{64}")


def token_digest(token: str) -> str:
    """The SHA-256 (lowercase hex) under which a bearer token is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def normalize_fingerprint(value: str) -> str:
    """A SHA-256 certificate fingerprint as 64 lowercase hex digits (``AB:CD:…`` accepted).

    Raises:
        ValueError: anything that is not a SHA-256 fingerprint (a SHA-1 one included).
    """
    digits = value.strip().replace(":", "").lower()
    if not _FINGERPRINT_RULE.fullmatch(digits):
        raise ValueError("a certificate fingerprint is the SHA-256 of its DER encoding, 64 hex digits")
    return digits


def check_agent_session(record: AgentSessionRecord, now: datetime) -> None:
    """Refuse an agent session that can no longer authorize anything, as of ``now``.

    Raises:
        AgentSessionRevoked: it was revoked (at any time: revocation takes effect at once).
        AgentSessionExpired: ``now`` is at or past its expiry.
    """
    # (1) revocation first: an operator's decision outranks the calendar.
    if record.revoked_at is not None:
        raise AgentSessionRevoked(cause="revoked")
    # (2) expiry, evaluated at call time, never at connect time.
    if now >= record.expires_at:
        raise AgentSessionExpired(cause="expired")


def principal_for(credential: CredentialRecord, record: AgentSessionRecord) -> Principal:
    """The principal of a checked credential and its agent session."""
    return Principal(
        agent=record.agent,
        agent_session_id=record.agent_session_id,
        human=record.human,
        team=record.team,
        scopes=record.scopes,
        credential_id=credential.credential_id,
        expires_at=record.expires_at,
    )


class StoreBearerAuth:
    """Agents known by credentials bound to agent sessions in the store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def authenticate(
        self, authorization_header: str | None, query_string: bytes, now: datetime
    ) -> Principal:
        """The principal behind a bearer token, its agent session checked as of ``now``.

        Raises:
            Unauthenticated: no credential, a malformed one, one in the query string,
                an unknown one or a superseded one (one answer; ``cause`` differs).
            AgentSessionRevoked, AgentSessionExpired: as :func:`check_agent_session`.
        """
        # (1) URLs end up in logs: a credential there is refused outright.
        lowered = query_string.lower()
        if any(lowered.startswith(k) or b"&" + k in lowered for k in _QUERY_TOKEN_KEYS):
            raise Unauthenticated(
                "Unauthorized: credentials in the query string are refused", cause="query_string"
            )
        # (2) the Bearer scheme, with a token.
        if not authorization_header:
            raise Unauthenticated(cause="missing")
        scheme, _, token = authorization_header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("Unauthorized: use the Bearer scheme", cause="scheme")
        # (3)-(5) lookup by digest of a high-entropy secret: timing reveals nothing about it.
        return await self._resolve(CredentialKind.BEARER, token_digest(token), now)

    async def principal_for_certificate(self, fingerprint: str, now: datetime) -> Principal:
        """The principal behind a verified client certificate's SHA-256 fingerprint.

        Raises:
            Unauthenticated: a malformed, unknown or superseded fingerprint.
            AgentSessionRevoked, AgentSessionExpired: as :func:`check_agent_session`.
        """
        try:
            digest = normalize_fingerprint(fingerprint)
        except ValueError:
            raise Unauthenticated("Unauthorized: unusable client certificate", cause="fingerprint") from None
        return await self._resolve(CredentialKind.MTLS, digest, now)

    async def _resolve(self, kind: CredentialKind, digest: str, now: datetime) -> Principal:
        # (3) the credential: unknown and superseded look alike on the wire.
        found = await self._store.find_credential(kind, digest)
        if found is None:
            raise Unauthenticated("Unauthorized: unknown credential", cause="unknown")
        credential, record = found
        if credential.superseded_at is not None:
            raise Unauthenticated("Unauthorized: unknown credential", cause="superseded")
        # (4) its agent session, as of now.
        check_agent_session(record, now)
        # (5) who it is.
        return principal_for(credential, record)


def client_certificate_fingerprint(
    scope: Mapping[str, Any],
    *,
    trusted_header: str | None = None,
    trusted_proxies: Iterable[str] = (),
) -> str | None:
    """The verified client certificate's SHA-256 fingerprint for this ASGI request, or ``None``.

    (1) The ASGI TLS extension, when the server fills it in (the server
    verified the chain). (2) Otherwise ``trusted_header``, only when the
    immediate peer is one of ``trusted_proxies``. Neither configured: ``None``.

    Raises:
        Unauthenticated: the header came from a peer that is not a trusted proxy,
            or carries something that is not a SHA-256 fingerprint.
    """
    tls = (scope.get("extensions") or {}).get("tls")
    if isinstance(tls, Mapping):
        chain = list(tls.get("client_cert_chain") or ())
        if chain:
            der = ssl.PEM_cert_to_DER_cert(str(chain[0]))
            return hashlib.sha256(der).hexdigest()
    if trusted_header is None:
        return None
    wanted = trusted_header.lower().encode("latin-1")
    values = [v for k, v in scope.get("headers", ()) if k.lower() == wanted]
    if not values:
        return None
    client = scope.get("client")
    peer = client[0] if client else None
    if peer not in set(trusted_proxies) or len(values) != 1:
        raise Unauthenticated("Unauthorized: untrusted client certificate header", cause="untrusted_peer")
    try:
        return normalize_fingerprint(values[0].decode("latin-1"))
    except ValueError:
        raise Unauthenticated("Unauthorized: unusable client certificate", cause="fingerprint") from None
