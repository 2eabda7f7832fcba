"""The admin API under ``/admin/``: agent sessions and their credentials (DESIGN sections 1 and 8).

Owns: creating, listing, showing, revoking and renewing agent sessions over
HTTP, behind its own credential (a bearer token whose SHA-256 is configured).
An agent's credential never works here. With no admin credential configured
every route answers 403 ``admin_disabled``: the API is off unless turned on.

An opaque bearer token is minted here, returned once (``Cache-Control:
no-store``) and stored only as its SHA-256; it is never logged. Every error is
JSON, ``{"error": {"reason", "message"}}``, with a stable ``reason``.

Revocation is durable before anything else happens; ``on_revoke`` (the
gateway's) then cuts what the agent session still has live, and its summary
is returned. If that callback fails, the revocation still stands (every call
re-checks the agent session) and the answer says so.
"""

from __future__ import annotations

import enum
import hmac
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timedelta
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.auth.agent_session import check_agent_session, normalize_fingerprint, token_digest
from bastion.errors import (
    AgentSessionExpired,
    AgentSessionRevoked,
    BastionError,
    Conflict,
    NotDurable,
    Reason,
    StoreError,
)
from bastion.ids import AgentId
from bastion.store.base import AgentSessionRecord, CredentialKind, CredentialRecord, Store

__all__ = ["AdminGate", "AdminReason", "admin_routes", "agent_session_json", "mint_token"]

logger = logging.getLogger(__name__)

OnRevoke = Callable[[AgentSessionRecord], Awaitable[dict[str, Any]]]
Endpoint = Callable[[Request], Awaitable[Response]]

_DIGEST_RULE = re.compile(r"[0-9a-f]{64}")
_MAX_BODY_BYTES = 64 * 1024
_MAX_TTL_S = 366 * 86400
_QUERY_TOKEN_KEYS = ("access_token=", "token=", "bearer=")

M = TypeVar("M", bound=BaseModel)
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]


class AdminReason(enum.StrEnum):
    """Reasons only the admin API gives; the shared ones come from :class:`bastion.errors.Reason`."""

    ADMIN_DISABLED = "admin_disabled"
    AGENT_SESSION_NOT_FOUND = "agent_session_not_found"
    CREDENTIAL_NOT_FOUND = "credential_not_found"
    REVOCATION_NOT_PROPAGATED = "revocation_not_propagated"
    CREDENTIAL_HOLDS_ANOTHER_ROLE = "credential_holds_another_role"


# What an operator needs to turn it on (issue #26 point 3): the setting and how to fill it.
ADMIN_DISABLED_MESSAGE = (
    "the admin API is not configured: set [auth] admin_token_sha256 in the configuration to the"
    " SHA-256 of an admin token (`bastion hash-token < admin.token` prints it) and restart the gateway"
)


class _Refused(Exception):
    def __init__(self, status: int, reason: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.extra = status, reason, message, extra


def mint_token() -> str:
    """A fresh opaque bearer token: 256 random bits, URL-safe."""
    return "bst_" + secrets.token_urlsafe(32)


class AdminGate:
    """The admin credential check and the JSON error rendering, around one endpoint each."""

    def __init__(self, admin_token_sha256: str | None) -> None:
        if admin_token_sha256 is not None and not _DIGEST_RULE.fullmatch(admin_token_sha256.lower()):
            raise ValueError("admin_token_sha256 must be the 64-hex-digit SHA-256 of the admin token")
        self._digest = None if admin_token_sha256 is None else admin_token_sha256.lower()

    def wrap(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` behind the gate: refusals and store errors become JSON answers."""

        async def guarded(request: Request) -> Response:
            try:
                self._check(request)
                return await endpoint(request)
            except _Refused as refused:
                return _error(refused.status, refused.reason, refused.message, **refused.extra)
            except BastionError as exc:
                status, reason = _store_status(exc)
                return _error(status, reason, exc.message)

        return guarded

    def admits(self, request: Request) -> bool:
        """Whether ``request`` carries the admin credential (for answers that only say more to it)."""
        try:
            self._check(request)
        except _Refused:
            return False
        return True

    def _check(self, request: Request) -> None:
        # (1) off unless configured: fail closed.
        if self._digest is None:
            raise _Refused(403, AdminReason.ADMIN_DISABLED, ADMIN_DISABLED_MESSAGE)
        # (2) never a credential in the URL.
        query = request.url.query.lower()
        if any(query.startswith(k) or "&" + k in query for k in _QUERY_TOKEN_KEYS):
            raise _Refused(401, Reason.CREDENTIAL_INVALID, "credentials in the query string are refused")
        # (3) the admin token, compared by digest in constant time.
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _Refused(401, Reason.CREDENTIAL_INVALID, "the admin API needs its bearer credential")
        if not hmac.compare_digest(token_digest(token), self._digest):
            raise _Refused(401, Reason.CREDENTIAL_INVALID, "not the admin credential")


class _CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    human: Name
    agent: Name
    team: Name | None = None
    scopes: list[Name] = Field(default_factory=list, max_length=256)
    ttl_s: float = Field(gt=0, le=_MAX_TTL_S)
    credential_kind: CredentialKind = CredentialKind.BEARER
    certificate_fingerprint: str | None = None


class _RevokeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: Name
    reason: Annotated[str, StringConstraints(strip_whitespace=True, max_length=1024)] = ""


class _RenewBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    credential_id: Name | None = None
    certificate_fingerprint: str | None = None


def admin_routes(
    store: Store,
    *,
    admin_token_sha256: str | None,
    clock: Callable[[], datetime],
    on_revoke: OnRevoke | None = None,
    configured_digests: Callable[[], Collection[str]] = frozenset,
) -> list[Route]:
    """The ``/admin/agent-sessions`` routes, behind the admin credential.

    ``clock`` returns the timezone-aware time that creation, expiry, revocation
    and renewal are decided at. ``on_revoke(record)`` runs after a revocation
    is durable (every time, so repeating a revocation cuts again) and returns
    a JSON summary of what it ended. ``configured_digests()`` returns the
    credential digests the configuration gives a role (static agents, admin,
    auditors): a store credential never takes one of them (409, one credential,
    one role). Raises :class:`ValueError` for a malformed ``admin_token_sha256``.
    """
    gate = AdminGate(admin_token_sha256)

    def one_role(digest: str) -> None:
        if digest in configured_digests():
            raise _Refused(
                409,
                AdminReason.CREDENTIAL_HOLDS_ANOTHER_ROLE,
                "this credential already holds a role in the configuration; one credential, one role",
            )

    async def create(request: Request) -> Response:
        body = await _body(request, _CreateBody)
        digest, token = _new_credential(body.credential_kind, body.certificate_fingerprint)
        one_role(digest)
        now = clock()
        record = await store.create_agent_session(
            human=body.human,
            agent=AgentId(body.agent),
            team=body.team,
            scopes=frozenset(body.scopes),
            now=now,
            expires_at=now + timedelta(seconds=body.ttl_s),
        )
        credential = await store.add_credential(
            record.agent_session_id, body.credential_kind, digest, now=now
        )
        answer: dict[str, Any] = {
            "agent_session": agent_session_json(record, now),
            "credential": _credential_json(credential),
        }
        if token is not None:
            answer["token"] = token
        return JSONResponse(answer, status_code=201, headers={"cache-control": "no-store"})

    async def list_all(request: Request) -> Response:
        agent = request.query_params.get("agent")
        records = await store.list_agent_sessions(agent=None if agent is None else AgentId(agent))
        now = clock()
        return JSONResponse({"agent_sessions": [agent_session_json(r, now) for r in records]})

    async def show(request: Request) -> Response:
        record = await _existing(store, request)
        credentials = await store.list_credentials(record.agent_session_id)
        return JSONResponse(
            {
                "agent_session": agent_session_json(record, clock()),
                "credentials": [_credential_json(c) for c in credentials],
            }
        )

    async def revoke(request: Request) -> Response:
        before = await _existing(store, request)
        body = await _body(request, _RevokeBody)
        now = clock()
        record = await store.revoke_agent_session(
            before.agent_session_id, by=body.by, reason=body.reason, now=now
        )
        answer: dict[str, Any] = {
            "agent_session": agent_session_json(record, now),
            "already_revoked": before.revoked_at is not None,
            "ended": None,
        }
        if on_revoke is not None:
            try:
                answer["ended"] = await on_revoke(record)
            except Exception:
                logger.exception(
                    "revocation is durable but cutting live sessions failed",
                    extra={"agent_session_id": record.agent_session_id},
                )
                answer["error"] = {
                    "reason": AdminReason.REVOCATION_NOT_PROPAGATED.value,
                    "message": "the revocation is durable; live transport sessions are refused at their"
                    " next request, but cutting them now failed",
                }
                return JSONResponse(answer, status_code=500)
        return JSONResponse(answer)

    async def renew(request: Request) -> Response:
        record = await _existing(store, request)
        body = await _body(request, _RenewBody)
        old = await _credential_to_renew(store, record, body.credential_id)
        digest, token = _new_credential(old.kind, body.certificate_fingerprint)
        one_role(digest)
        credential = await store.renew_credential(old.credential_id, digest, now=clock())
        answer: dict[str, Any] = {"credential": _credential_json(credential), "superseded": old.credential_id}
        if token is not None:
            answer["token"] = token
        return JSONResponse(answer, headers={"cache-control": "no-store"})

    return [
        Route("/admin/agent-sessions", gate.wrap(create), methods=["POST"]),
        Route("/admin/agent-sessions", gate.wrap(list_all), methods=["GET"]),
        Route("/admin/agent-sessions/{agent_session_id}", gate.wrap(show), methods=["GET"]),
        Route("/admin/agent-sessions/{agent_session_id}/revoke", gate.wrap(revoke), methods=["POST"]),
        Route("/admin/agent-sessions/{agent_session_id}/renew", gate.wrap(renew), methods=["POST"]),
    ]


def agent_session_json(record: AgentSessionRecord, now: datetime) -> dict[str, Any]:
    """The wire form of an agent session, with its ``state`` as of ``now``."""
    try:
        check_agent_session(record, now)
        state = "active"
    except AgentSessionRevoked:
        state = "revoked"
    except AgentSessionExpired:
        state = "expired"
    return {
        "agent_session_id": record.agent_session_id,
        "human": record.human,
        "agent": record.agent,
        "team": record.team,
        "scopes": sorted(record.scopes),
        "created_at": _iso(record.created_at),
        "expires_at": _iso(record.expires_at),
        "revoked_at": _iso(record.revoked_at),
        "revoked_by": record.revoked_by,
        "revoke_reason": record.revoke_reason,
        "state": state,
    }


def _credential_json(credential: CredentialRecord) -> dict[str, Any]:
    # A bearer digest is kept off the wire: it is the lookup key of a live secret.
    answer: dict[str, Any] = {
        "credential_id": credential.credential_id,
        "kind": credential.kind.value,
        "created_at": _iso(credential.created_at),
        "superseded_at": _iso(credential.superseded_at),
        "renewed_from": credential.renewed_from,
    }
    if credential.kind is CredentialKind.MTLS:
        answer["certificate_fingerprint"] = credential.digest
    return answer


def _new_credential(kind: CredentialKind, fingerprint: str | None) -> tuple[str, str | None]:
    """``(digest, token)``: a minted token for ``bearer``, the given fingerprint for ``mtls``."""
    if kind is CredentialKind.BEARER:
        if fingerprint is not None:
            raise _Refused(
                400, Reason.INVALID_REQUEST, "a bearer credential takes no certificate_fingerprint"
            )
        token = mint_token()
        return token_digest(token), token
    if fingerprint is None:
        raise _Refused(400, Reason.INVALID_REQUEST, "an mtls credential needs certificate_fingerprint")
    try:
        return normalize_fingerprint(fingerprint), None
    except ValueError as exc:
        raise _Refused(400, Reason.INVALID_REQUEST, str(exc)) from None


async def _existing(store: Store, request: Request) -> AgentSessionRecord:
    # Agent sessions are never deleted, so existence checked here still holds at the write.
    record = await store.get_agent_session(request.path_params["agent_session_id"])
    if record is None:
        raise _Refused(404, AdminReason.AGENT_SESSION_NOT_FOUND, "no such agent session")
    return record


async def _credential_to_renew(
    store: Store, record: AgentSessionRecord, credential_id: str | None
) -> CredentialRecord:
    credentials = await store.list_credentials(record.agent_session_id)
    if credential_id is not None:
        for credential in credentials:
            if credential.credential_id == credential_id:
                return credential
        raise _Refused(404, AdminReason.CREDENTIAL_NOT_FOUND, "no such credential on this agent session")
    current = [c for c in credentials if c.superseded_at is None]
    if len(current) == 1:
        return current[0]
    if not current:
        raise _Refused(409, Reason.CONFLICT, "the agent session has no current credential to renew")
    raise _Refused(400, Reason.INVALID_REQUEST, "several current credentials: name credential_id")


async def _body(request: Request, model: type[M]) -> M:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > _MAX_BODY_BYTES):
        raise _Refused(413, Reason.BODY_TOO_LARGE, "the request body is too large")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _MAX_BODY_BYTES:
            raise _Refused(413, Reason.BODY_TOO_LARGE, "the request body is too large")
    try:
        return model.model_validate_json(bytes(raw) or b"{}")
    except ValidationError as exc:
        # Locations and messages only: never echo the submitted values.
        problems = [
            {"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
            for e in exc.errors(include_input=False, include_url=False)
        ]
        raise _Refused(400, Reason.INVALID_REQUEST, "invalid request body", problems=problems) from None


def _store_status(exc: BastionError) -> tuple[int, str]:
    if isinstance(exc, AgentSessionRevoked | AgentSessionExpired | Conflict):
        return 409, exc.reason.value
    if isinstance(exc, NotDurable | StoreError):
        return 503, exc.reason.value
    return 500, exc.reason.value


def _error(status: int, reason: str, message: str, **extra: Any) -> Response:
    headers = {"www-authenticate": 'Bearer realm="bastion-admin"'} if status == 401 else None
    body = {"error": {"reason": str(reason), "message": message, **extra}}
    return JSONResponse(body, status_code=status, headers=headers)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")
