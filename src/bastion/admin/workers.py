"""Worker and attachment visibility on the admin API (DESIGN section 6, issue #5 point 7).

Owns two read-only routes behind the admin credential (:class:`AdminGate`):

- ``GET /admin/workers``: every registered worker identity with its role,
  generation, epoch, liveness, heartbeat age, launch provenance, owning
  sessions (from live attachment records only; ``"unproven"`` when none) and
  cohort, as ``bastion workers`` prints them;
- ``GET /admin/sessions``: every live client transport session (session era),
  across replicas (they are store records): its reference, owner agent and
  agent session, protocol version, client, creating replica, times, and the
  ownership records naming it; ``?agent=`` narrows to one agent (issue #26).
  Sessionless requests have no transport session and are not listed;
- ``GET /admin/sessions/{transport_session_ref}/attachments``: per namespace,
  the ``connected`` and ``attached`` evidence of one client transport session
  and its condition, plus the ownership records the store holds for it. The
  path names the session by its reference (``workers.attachment.transport_session_ref``),
  never by its ``Mcp-Session-Id``;
- ``POST /admin/sessions/{transport_session_ref}/reattach`` with
  ``{"namespace": "..."}``: the sanctioned recovery of a missing attachment
  (``AttachmentTracker.reattach``: re-initialize that session's upstream
  session and refresh its surface). Never a process kill.

Nothing here writes to the store.
"""

from __future__ import annotations

import enum
import json
import socket
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion.admin.api import AdminGate
from bastion.store.base import AttachmentRecord, Store
from bastion.store.replicas import TransportSessionRecord
from bastion.workers.attachment import AttachmentTracker, session_ref_of_key
from bastion.workers.liveness import PidAlive, pid_alive
from bastion.workers.registry import UNPROVEN, describe_workers

__all__ = ["WorkersReason", "worker_routes"]


class WorkersReason(enum.StrEnum):
    TRANSPORT_SESSION_NOT_FOUND = "transport_session_not_found"
    REATTACH_UNAVAILABLE = "reattach_unavailable"
    INVALID_REQUEST = "invalid_request"


_MAX_BODY_BYTES = 4096


def worker_routes(
    store: Store,
    gate: AdminGate,
    *,
    clock: Callable[[], datetime],
    attachments: AttachmentTracker | None,
    lease_s: float,
    pid_alive: PidAlive = pid_alive,
    this_host: str | None = None,
    idle_timeout_s: Callable[[], float] = lambda: 1800.0,
) -> list[Route]:
    """The ``/admin/workers`` and ``/admin/sessions/{ref}/...`` routes, behind ``gate``.

    ``clock`` returns the timezone-aware time liveness is judged at, with a
    lease of ``lease_s`` seconds (the gateway's). ``attachments`` is this
    gateway's tracker (``None``: no live evidence here, only store records).
    ``idle_timeout_s()`` is the transport session idle timeout in force: a
    session not seen for that long is not live and is not listed.
    """
    host = this_host if this_host is not None else socket.gethostname()

    async def list_workers(request: Request) -> Response:
        now = clock()
        views = await describe_workers(store, now=now, lease_s=lease_s, pid_alive=pid_alive, this_host=host)
        return JSONResponse(
            {"as_of": _iso(now), "lease_s": lease_s, "workers": [view.to_json() for view in views]}
        )

    async def list_sessions(request: Request) -> Response:
        now = clock()
        idle_s = idle_timeout_s()
        records = await store.list_transport_sessions(seen_since=now - timedelta(seconds=idle_s))
        agent = request.query_params.get("agent")
        owners: dict[str, list[AttachmentRecord]] = defaultdict(list)
        for attachment in await store.list_attachments():
            owners[attachment.transport_session_ref].append(attachment)
        sessions = [_session_json(r, owners) for r in records if agent is None or r.agent == agent]
        return JSONResponse({"as_of": _iso(now), "idle_timeout_s": idle_s, "sessions": sessions})

    async def session_attachments(request: Request) -> Response:
        ref = request.path_params["transport_session_ref"]
        records = await store.list_attachments(transport_session_ref=ref)
        evidence = attachments.describe(ref) if attachments is not None else None
        if evidence is None and not records:
            return _error(
                404,
                WorkersReason.TRANSPORT_SESSION_NOT_FOUND,
                "no attachment evidence or record for this transport session",
            )
        return JSONResponse(
            {
                "transport_session_ref": ref,
                "evidence": evidence["namespaces"] if evidence is not None else UNPROVEN,
                "surface_listed_at": evidence["surface_listed_at"] if evidence is not None else None,
                "ownership_records": [_record_json(r) for r in records],
            }
        )

    async def reattach(request: Request) -> Response:
        ref = request.path_params["transport_session_ref"]
        namespace = await _namespace_of(request)
        if namespace is None:
            return _error(400, WorkersReason.INVALID_REQUEST, 'the body is {"namespace": "<namespace>"}')
        if attachments is None or attachments.describe(ref) is None:
            return _error(404, WorkersReason.TRANSPORT_SESSION_NOT_FOUND, "no live transport session here")
        try:
            evidence = await attachments.reattach(ref, namespace)
        except RuntimeError:
            return _error(409, WorkersReason.REATTACH_UNAVAILABLE, "this gateway has no re-attach path")
        return JSONResponse({"transport_session_ref": ref, "evidence": evidence.to_json()})

    return [
        Route("/admin/workers", gate.wrap(list_workers), methods=["GET"]),
        Route("/admin/sessions", gate.wrap(list_sessions), methods=["GET"]),
        Route(
            "/admin/sessions/{transport_session_ref}/reattach",
            gate.wrap(reattach),
            methods=["POST"],
        ),
        Route(
            "/admin/sessions/{transport_session_ref}/attachments",
            gate.wrap(session_attachments),
            methods=["GET"],
        ),
    ]


async def _namespace_of(request: Request) -> str | None:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _MAX_BODY_BYTES:
            return None
    try:
        body = json.loads(bytes(raw) or b"{}")
    except ValueError:
        return None
    namespace = body.get("namespace") if isinstance(body, dict) and len(body) == 1 else None
    return namespace if isinstance(namespace, str) and namespace else None


def _error(status: int, reason: WorkersReason, message: str) -> Response:
    return JSONResponse({"error": {"reason": reason.value, "message": message}}, status_code=status)


def _session_json(
    record: TransportSessionRecord, owners: dict[str, list[AttachmentRecord]]
) -> dict[str, Any]:
    """One live transport session; ``transport_session_ref`` is what ``/admin/sessions/{ref}`` takes."""
    ref = session_ref_of_key(record.key)
    client = record.client_info
    return {
        "transport_session_ref": ref,
        "agent": record.agent,
        "agent_session_id": record.agent_session_id,
        "protocol_version": record.protocol_version,
        "client": {"name": client.get("name"), "version": client.get("version")},
        "created_at": _iso(record.created_at),
        "last_seen_at": _iso(record.last_seen_at),
        "created_by": record.created_by,
        "ownership_records": [_record_json(a) for a in owners.get(ref, [])],
    }


def _record_json(record: AttachmentRecord) -> dict[str, Any]:
    return {
        "worker_id": record.worker_id,
        "namespace": record.namespace,
        "attached_at": _iso(record.attached_at),
        "writer": record.writer,
        "epoch": record.epoch,
    }


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
