"""``/admin/approvals``: list, show, approve and deny step-up approval requests (issue 27).

Reading (list, show) takes an approver's credential or the admin's. Deciding
takes an approver's own credential (``[auth.approvers.NAME] token_sha256``)
and nothing else: the admin credential is refused (``approver_role_required``),
and so is an approver the request's grant does not name
(``approver_not_named``). A request is decided once: a second decision, or
one after the request expired, is 409 and changes nothing. The decision is
durable in the store before the answer, and the call waiting on it (at this
replica at once, at another through the change feed) writes it into its
chain with the approver's name and the times. Errors are the admin API's
JSON, ``{"error": {"reason", "message"}}``; no credential is ever echoed.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.admin.api import AdminGate, _body, _error, _Refused
from bastion.approvals.views import approval_json
from bastion.approvals.waiters import ApprovalWaiters
from bastion.auth.agent_session import token_digest
from bastion.errors import BastionError, Reason
from bastion.store.approvals import ApprovalRecord, ApprovalState, ApprovalStore

__all__ = ["ApprovalReason", "approval_routes"]

Endpoint = Callable[[Request], Awaitable[Response]]


class ApprovalReason(enum.StrEnum):
    APPROVAL_NOT_FOUND = "approval_not_found"
    APPROVER_ROLE_REQUIRED = "approver_role_required"
    APPROVER_NOT_NAMED = "approver_not_named"
    APPROVAL_ALREADY_DECIDED = "approval_already_decided"
    APPROVAL_EXPIRED = "approval_expired"


class _DecideBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: Annotated[str, StringConstraints(strip_whitespace=True, max_length=1024)] | None = None


def approval_routes(
    store: ApprovalStore,
    admin: AdminGate,
    *,
    approvers: Callable[[], Mapping[str, str]],
    waiters: ApprovalWaiters,
    clock: Callable[[], datetime],
) -> list[Route]:
    """The approval routes. ``approvers()`` is the snapshot's ``{name: token digest}`` in force."""

    def approver_of(request: Request) -> str | None:
        """The approver presenting this request, or ``None`` for the admin; raises otherwise."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            digest = token_digest(token)
            found = None
            for name, expected in approvers().items():
                if hmac.compare_digest(digest, expected):
                    found = name
            if found is not None:
                return found
        if admin.admits(request):
            return None
        raise _Refused(
            401, Reason.CREDENTIAL_INVALID, "the approvals API needs an approver's or the admin credential"
        )

    def guarded(endpoint: Callable[[Request, str | None], Awaitable[Response]]) -> Endpoint:
        async def run(request: Request) -> Response:
            try:
                return await endpoint(request, approver_of(request))
            except _Refused as refused:
                return _error(refused.status, refused.reason, refused.message, **refused.extra)
            except BastionError as exc:
                return _error(503, exc.reason.value, exc.message)

        return run

    async def existing(request: Request) -> ApprovalRecord:
        record = await store.get_approval(request.path_params["approval_id"])
        if record is None:
            raise _Refused(404, ApprovalReason.APPROVAL_NOT_FOUND, "no such approval request")
        return record

    async def list_all(request: Request, _: str | None) -> Response:
        wanted = request.query_params.get("state")
        try:
            state = None if wanted in (None, "", "all") else ApprovalState(wanted)
        except ValueError:
            states = ", ".join(s.value for s in ApprovalState)
            raise _Refused(400, Reason.INVALID_REQUEST, f"state must be one of: all, {states}") from None
        records = await store.list_approvals(state=state)
        return JSONResponse({"approvals": [approval_json(r) for r in records]})

    async def show(request: Request, _: str | None) -> Response:
        return JSONResponse({"approval": approval_json(await existing(request))})

    def decide(state: ApprovalState) -> Callable[[Request, str | None], Awaitable[Response]]:
        async def run(request: Request, approver: str | None) -> Response:
            # (1) Only an approver decides, never the admin; (2) only one the grant names.
            if approver is None:
                raise _Refused(
                    403,
                    ApprovalReason.APPROVER_ROLE_REQUIRED,
                    "only an approver's own credential decides an approval request",
                )
            record = await existing(request)
            if approver not in record.approvers:
                raise _Refused(
                    403,
                    ApprovalReason.APPROVER_NOT_NAMED,
                    f"approver {approver} is not named for this request",
                )
            body = await _body(request, _DecideBody)
            # (3) Once: the store moves only a pending, unexpired request.
            moved = await store.decide_approval(
                record.approval_id, state, by=approver, note=body.note, now=clock()
            )
            if moved is None:
                raise _Refused(404, ApprovalReason.APPROVAL_NOT_FOUND, "no such approval request")
            after, changed = moved
            if not changed:
                reason = (
                    ApprovalReason.APPROVAL_EXPIRED
                    if after.pending
                    else ApprovalReason.APPROVAL_ALREADY_DECIDED
                )
                return _error(409, reason, f"not {state.value}: the request is {after.state.value}",
                              approval=approval_json(after))  # fmt: skip
            waiters.wake(after.approval_id)  # the call waiting here goes on at once
            return JSONResponse({"approval": approval_json(after)})

        return run

    return [
        Route("/admin/approvals", guarded(list_all), methods=["GET"]),
        Route("/admin/approvals/{approval_id}", guarded(show), methods=["GET"]),
        Route(
            "/admin/approvals/{approval_id}/approve",
            guarded(decide(ApprovalState.APPROVED)),
            methods=["POST"],
        ),
        Route("/admin/approvals/{approval_id}/deny", guarded(decide(ApprovalState.DENIED)), methods=["POST"]),
    ]
