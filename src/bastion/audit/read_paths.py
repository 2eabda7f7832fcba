"""Read paths for evidence (DESIGN section 4): the TRACE claim and the JSON Lines export of one session.

``GET /sessions/{session_id}/trace-claim`` before the chain closed answers 404
with reason ``claim_not_issued`` and ``Retry-After`` (an unknown or foreign
session is 404 ``session_not_found``).

Only the agent that owns the evidence session, or an auditor credential,
may read it; anyone else gets the same 404 as for a session that does not
exist. Exports stream page by page, so memory stays flat in chain length.

``GET /audit/execution?execution_id=X[&agent=A]`` (issue #11 point 11): every
entry of one ``(agent, execution_id)``, in every evidence session, as JSON
Lines by time (``Store.find_entries``). An auditor names any agent (or none:
every agent's); an agent reads its own only, and naming another agent is the
same 404 as an unknown session.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Scope

from bastion.audit.export import claim_bytes, entry_line
from bastion.auth.principal import Principal
from bastion.errors import BastionError, SessionNotFound
from bastion.ids import AgentId, EvidenceSessionId, ExecutionId
from bastion.store.base import Store

__all__ = ["EvidenceReadPaths"]

_PAGE = 1000
# Seconds a client waits before asking again for a claim not issued yet.
_CLAIM_RETRY_AFTER_S = 1


class EvidenceReadPaths:
    def __init__(
        self,
        store: Callable[[], Store],
        authenticate: Callable[[Scope, str | None], Awaitable[Principal]],
        auditor_token_hashes: Callable[[], frozenset[str]],
    ) -> None:
        self._store = store
        self._authenticate = authenticate
        self._auditors = auditor_token_hashes

    def _is_auditor(self, request: Request) -> bool:
        scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
        return (
            scheme.lower() == "bearer"
            and hashlib.sha256(token.strip().encode()).hexdigest() in self._auditors()
        )

    async def execution(self, request: Request) -> Response:
        execution_id = request.query_params.get("execution_id", "")
        agent = request.query_params.get("agent") or None
        try:
            if not execution_id:
                raise SessionNotFound("execution_id is required")
            if not self._is_auditor(request):
                principal = await self._authenticate(request.scope, request.headers.get("authorization"))
                if agent is not None and agent != principal.agent:
                    raise SessionNotFound(cause="foreign")
                agent = principal.agent
        except BastionError as exc:
            return _error(exc)
        entries = await self._store().find_entries(
            ExecutionId(execution_id), agent=AgentId(agent) if agent is not None else None
        )
        return Response(b"".join(entry_line(entry) for entry in entries), media_type="application/jsonl")

    async def _authorize(self, request: Request, session_id: str) -> None:
        """Return if the caller may read ``session_id``; raise the typed error otherwise."""
        header = request.headers.get("authorization")
        if self._is_auditor(request):
            chain = await self._store().get_chain(EvidenceSessionId(session_id))
            if chain is None:
                raise SessionNotFound()
            return
        principal = await self._authenticate(request.scope, header)
        chain = await self._store().get_chain(EvidenceSessionId(session_id))
        if chain is None or chain.agent != principal.agent:
            raise SessionNotFound(cause="foreign" if chain is not None else "unknown")

    async def trace_claim(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            await self._authorize(request, session_id)
        except BastionError as exc:
            return _error(exc)
        claim = await self._store().get_claim(EvidenceSessionId(session_id))
        if claim is None:
            # Typed, not an error of the gateway: the chain is open (a shared sessionless chain closes
            # within its age bound; a session-era one when its session ends). Poll again later.
            return JSONResponse(
                {"error": {"reason": "claim_not_issued", "message": "the evidence session is still open"}},
                status_code=404,
                headers={"retry-after": str(_CLAIM_RETRY_AFTER_S)},
            )
        # Byte-exact RFC 8785 + newline, as `bastion verify` expects a claim file to be.
        return Response(claim_bytes(claim), media_type="application/json")

    async def export(self, request: Request) -> Response:
        session_id = request.query_params.get("session_id", "")
        try:
            if not session_id:
                raise SessionNotFound("session_id is required")
            await self._authorize(request, session_id)
        except BastionError as exc:
            return _error(exc)
        store = self._store()

        async def lines() -> AsyncIterator[bytes]:
            start = 0
            while True:
                page = await store.read_chain(EvidenceSessionId(session_id), start_seq=start, limit=_PAGE)
                for entry in page:
                    yield entry_line(entry)
                if len(page) < _PAGE:
                    return
                start = page[-1].seq + 1

        return StreamingResponse(lines(), media_type="application/jsonl")


def _error(exc: BastionError) -> Response:
    status = exc.http_status if exc.http_status == 401 else 404
    headers = {"www-authenticate": 'Bearer realm="bastion"'} if status == 401 else None
    return JSONResponse(
        {"error": {"reason": exc.reason.value, "message": exc.message}}, status_code=status, headers=headers
    )
