"""``bastion sessions list``: the live client transport sessions, across replicas (issue #26 point 9).

Reads a running gateway's ``GET /admin/sessions`` (``--url`` with the admin
credential from ``--admin-token-file``). Transport sessions are store records,
so any replica lists every replica's. Each row's ``REF`` is the reference that
``/admin/sessions/{ref}/attachments`` and ``/admin/sessions/{ref}/reattach``
take (never the ``Mcp-Session-Id``, which is a bearer of the session).
Sessionless requests (the 2026-07-28 era) have no transport session and are
not listed. ``--json`` prints the API's JSON. Exit status: 0 done, 1 refused or
unreachable, 2 unusable arguments or files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bastion.cli.admin_http import AdminArgumentsUnusable, admin_get, print_table

if TYPE_CHECKING:
    import httpx

__all__ = ["SESSION_COLUMNS", "add_sessions_parser", "run_sessions"]

SESSION_COLUMNS = ("ref", "agent", "protocol", "client", "created_by", "last_seen", "owners")


def add_sessions_parser(subparsers: Any) -> None:
    """Register ``sessions list`` on the ``bastion`` subparsers."""
    parser = subparsers.add_parser("sessions", help="live client transport sessions (admin API)")
    actions = parser.add_subparsers(dest="sessions_action", required=True)
    listing = actions.add_parser(
        "list",
        help="every live transport session of every replica, with the reference /admin/sessions/{ref} takes",
    )
    listing.add_argument("--url", required=True, help="a running gateway, e.g. http://127.0.0.1:8765")
    listing.add_argument(
        "--admin-token-file", type=Path, required=True, help="file holding the admin API's bearer token"
    )
    listing.add_argument("--agent", help="only this agent's sessions")
    listing.add_argument("--json", action="store_true", dest="as_json", help="print the API's JSON")
    listing.add_argument("--timeout", type=float, default=30.0, help="seconds per request")


def run_sessions(
    args: argparse.Namespace,
    *,
    http: httpx.Client | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``bastion sessions list``; returns the exit status. ``http`` replaces the client in tests."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    path = "/admin/sessions"
    if args.agent is not None:
        from urllib.parse import urlencode

        path += "?" + urlencode({"agent": args.agent})
    try:
        answer = admin_get(
            str(args.url), args.admin_token_file, path, timeout=args.timeout, http=http, err=err
        )
    except AdminArgumentsUnusable as exc:
        print(f"bastion: {exc}", file=err)
        return 2
    if answer is None:
        return 1
    if args.as_json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
        return 0
    sessions = answer.get("sessions", [])
    if not sessions:
        print("no live transport sessions (sessionless requests have none)", file=out)
        return 0
    print_table(SESSION_COLUMNS, [_row(s) for s in sessions], out)
    return 0


def _row(session: dict[str, Any]) -> list[str]:
    client = session.get("client") or {}
    owners = session.get("ownership_records") or []
    return [
        str(session.get("transport_session_ref")),
        str(session.get("agent")),
        str(session.get("protocol_version")),
        " ".join(str(client[k]) for k in ("name", "version") if client.get(k)) or "-",
        str(session.get("created_by")),
        str(session.get("last_seen_at")),
        ",".join(f"{o.get('namespace')}={o.get('worker_id')}" for o in owners) or "-",
    ]
