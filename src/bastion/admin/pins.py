"""Pinned definitions on the admin API: list, show, approve, reject (issue 27).

Routes behind the admin credential (:class:`AdminGate`):

- ``GET /admin/pins`` (``?server=``): every pin, with the offer against it, if any
  (digests, states, times; no definition text);
- ``GET /admin/pins/show?server=&kind=&name=``: one pin with both definitions
  (the pinned one and the offered one), for a diff;
- ``POST /admin/pins/approve`` and ``/admin/pins/reject`` with ``{"server",
  "kind", "name", "digest", "by"}``: the decision, durable and in the change
  feed before the answer (every replica re-admits that server within the
  feed's bound); ``digest`` is the offered digest the operator saw, so a newer
  offer since is a 409 ``conflict``. ``on_decided`` (the gateway's) then
  audits it and applies it here at once.

Definitions are the upstream's text, returned as JSON values: a client renders
them escaped (``bastion pins show`` does).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.admin.api import AdminGate, Name, _body, _iso, _Refused
from bastion.store.base import Store
from bastion.store.pins import PinKind, PinRecord

__all__ = ["PinsReason", "pin_json", "pin_routes"]

OnDecided = Callable[[PinRecord, str, str, bool], Awaitable[None]]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class PinsReason(enum.StrEnum):
    PIN_NOT_FOUND = "pin_not_found"
    INVALID_REQUEST = "invalid_request"


class _DecideBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    server: Name
    kind: PinKind
    name: Name
    digest: Digest
    by: Name


def pin_json(pin: PinRecord, *, definitions: bool = False) -> dict[str, Any]:
    """One pin as the API shows it; ``definitions``: with the pinned and offered definitions."""
    shown: dict[str, Any] = {
        "server": pin.server,
        "kind": pin.kind.value,
        "name": pin.name,
        "digest": pin.digest,
        "pinned_at": _iso(pin.pinned_at),
        "pinned_by": pin.pinned_by,
        "offer": None,
        "decided_at": _iso(pin.decided_at),
        "decided_by": pin.decided_by,
    }
    if pin.offered_digest is not None:
        shown["offer"] = {
            "digest": pin.offered_digest,
            "state": None if pin.offer_state is None else pin.offer_state.value,
            "offered_at": _iso(pin.offered_at),
        }
    if definitions:
        shown["definition"] = pin.definition
        if shown["offer"] is not None:
            shown["offer"]["definition"] = pin.offered_definition
    return shown


def pin_routes(
    store: Store, gate: AdminGate, *, clock: Callable[[], datetime], on_decided: OnDecided | None = None
) -> list[Route]:
    """The ``/admin/pins`` routes, behind ``gate``. ``clock``: timezone-aware decision times."""

    async def list_pins(request: Request) -> Response:
        server = request.query_params.get("server") or None
        return JSONResponse({"pins": [pin_json(p) for p in await store.list_pins(server=server)]})

    async def show(request: Request) -> Response:
        query = request.query_params
        server, kind, name = query.get("server", ""), query.get("kind", ""), query.get("name", "")
        if not server or not name or kind not in {k.value for k in PinKind}:
            raise _Refused(400, PinsReason.INVALID_REQUEST, "show needs server, kind and name")
        pin = await store.get_pin(server, PinKind(kind), name)
        if pin is None:
            raise _Refused(404, PinsReason.PIN_NOT_FOUND, "no pin of that name")
        return JSONResponse(pin_json(pin, definitions=True))

    def decide(approve: bool) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            body = await _body(request, _DecideBody)
            before = await store.get_pin(body.server, body.kind, body.name)
            if before is None:
                raise _Refused(404, PinsReason.PIN_NOT_FOUND, "no pin of that name")
            pin = await store.decide_pin(
                body.server, body.kind, body.name, body.digest, approve=approve, by=body.by, now=clock()
            )
            if on_decided is not None:
                await on_decided(pin, body.digest, before.digest, approve)
            return JSONResponse(pin_json(pin))

        return endpoint

    return [
        Route("/admin/pins", gate.wrap(list_pins), methods=["GET"]),
        Route("/admin/pins/show", gate.wrap(show), methods=["GET"]),
        Route("/admin/pins/approve", gate.wrap(decide(True)), methods=["POST"]),
        Route("/admin/pins/reject", gate.wrap(decide(False)), methods=["POST"]),
    ]
