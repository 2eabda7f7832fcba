"""``bastion approvals list|show|approve|deny``: step-up approval requests (issue 27).

Talks to a running gateway's ``/admin/approvals`` (``--url``), any replica:
the requests live in the store. ``--token-file`` holds the approver's own
token (``[auth.approvers.NAME] token_sha256``), or the admin token for
``list`` and ``show``; only an approver named by the request's grant can
``approve`` or ``deny``, once. ``show`` prints what the approver decides on:
agent, the human behind the agent session, server, tool, arguments (when the
grant shows them), binding and execution id. ``--json`` prints the API's
JSON. Exit status: 0 done, 1 refused or unreachable, 2 unusable arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote, urlencode

from bastion.cli.admin_http import AdminArgumentsUnusable, admin_get, admin_post, print_table

if TYPE_CHECKING:
    import httpx

__all__ = ["APPROVAL_COLUMNS", "add_approvals_parser", "run_approvals"]

APPROVAL_COLUMNS = ("approval_id", "state", "agent", "human", "server", "tool", "execution_id", "expires_at")
_SHOWN = (
    "approval_id", "state", "agent", "human", "agent_session_id", "server", "tool", "arguments", "binding",
    "execution_id", "call_id", "evidence_session_id", "grant", "approvers", "requested_at", "expires_at",
    "decided_at", "decided_by", "note",
)  # fmt: skip


def add_approvals_parser(subparsers: Any) -> None:
    """Register ``approvals`` and its actions on the ``bastion`` subparsers."""
    parser = subparsers.add_parser("approvals", help="step-up approval requests: list, show, approve, deny")
    actions = parser.add_subparsers(dest="approvals_action", required=True)
    for action, help_text in (
        ("list", "approval requests, newest first"),
        ("show", "one request: agent, human, server, tool, arguments, binding, execution id"),
        ("approve", "approve one pending request (an approver named by its grant, once)"),
        ("deny", "deny one pending request (an approver named by its grant, once)"),
    ):
        sub = actions.add_parser(action, help=help_text)
        sub.add_argument("--url", required=True, help="a running gateway, e.g. http://127.0.0.1:8765")
        sub.add_argument(
            "--token-file", type=Path, required=True, help="file holding your approver token (or the admin's)"
        )
        if action == "list":
            sub.add_argument(
                "--state", default="pending", help="pending (default), approved, denied, ... or all"
            )
        else:
            sub.add_argument("approval_id", help="the request's id (apr_...)")
        if action in ("approve", "deny"):
            sub.add_argument("--note", help="a note kept with the decision")
        sub.add_argument("--json", action="store_true", dest="as_json", help="print the API's JSON")
        sub.add_argument("--timeout", type=float, default=30.0, help="seconds per request")


def run_approvals(
    args: argparse.Namespace,
    *,
    http: httpx.Client | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``bastion approvals ...``; returns the exit status. ``http`` replaces the client in tests."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    action = args.approvals_action
    post: dict[str, Any] | None = None
    if action == "list":
        path = "/admin/approvals?" + urlencode({"state": args.state})
    else:
        path = "/admin/approvals/" + quote(args.approval_id, safe="")
        if action in ("approve", "deny"):
            path += "/" + action
            post = {} if args.note is None else {"note": args.note}
    try:
        if post is None:
            answer = admin_get(str(args.url), args.token_file, path, timeout=args.timeout, http=http, err=err)
        else:
            answer = admin_post(
                str(args.url), args.token_file, path, post, timeout=args.timeout, http=http, err=err
            )
    except AdminArgumentsUnusable as exc:
        print(f"bastion: {exc}", file=err)
        return 2
    if answer is None:
        return 1
    if args.as_json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    elif action == "list":
        rows = [[_cell(a.get(c)) for c in APPROVAL_COLUMNS] for a in answer.get("approvals", [])]
        print_table(APPROVAL_COLUMNS, rows, out)
    else:
        approval = answer.get("approval", {})
        for key in _SHOWN:
            value = approval.get(key)
            if key == "arguments" and not approval.get("arguments_shown"):
                value = "(not shown: the grant keeps them from approvers)"
            print(f"{key + ':':<21}{_cell(value)}", file=out)
    return 0


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True)
    return str(value)
