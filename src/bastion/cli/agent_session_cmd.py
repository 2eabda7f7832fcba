"""``bastion agent-session create|list|show|revoke|renew``: the admin API from the command line.

Talks to a running gateway's ``/admin/agent-sessions`` over HTTP with the
admin credential read from ``--admin-token-file`` (never from the command
line, where it would land in shell history and ``ps``). A minted agent token
is printed once, or written to ``--token-out`` (mode 0600) and not printed;
``bastion connect --credential`` reads that file. Output is a table, or the
API's JSON with ``--json``. Exit status: 0 done, 1 refused or unreachable,
2 unusable arguments or files.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bastion.cli.admin_http import AdminArgumentsUnusable
from bastion.cli.admin_http import read_secret as _read_secret

if TYPE_CHECKING:
    import httpx

__all__ = ["add_agent_session_parser", "parse_duration", "run_agent_session"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_LIST_COLUMNS = ("agent_session_id", "agent", "human", "team", "state", "expires_at")
_CREDENTIAL_COLUMNS = ("credential_id", "kind", "created_at", "superseded_at", "renewed_from")


_Unusable = AdminArgumentsUnusable  # arguments or files the command cannot use (exit 2)


def parse_duration(text: str) -> float:
    """Seconds in ``3600``, ``90s``, ``30m``, ``8h`` or ``7d``; raises :class:`ValueError` otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"not a positive duration: {text!r} (use 3600, 90s, 30m, 8h or 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def add_agent_session_parser(subparsers: Any) -> None:
    """Register ``agent-session`` and its actions on the ``bastion`` subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8765")
    common.add_argument(
        "--admin-token-file", type=Path, required=True, help="file holding the admin API's bearer token"
    )
    common.add_argument("--json", action="store_true", dest="as_json", help="print the API's JSON")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds per request")

    parser = subparsers.add_parser("agent-session", help="manage agent sessions through the admin API")
    actions = parser.add_subparsers(dest="agent_session_action", required=True)

    create = actions.add_parser("create", parents=[common], help="create an agent session and its credential")
    create.add_argument("--human", required=True, help="who the agent acts for")
    create.add_argument("--agent", required=True)
    create.add_argument("--team")
    create.add_argument("--scope", action="append", default=[], dest="scopes", help="repeat for several")
    create.add_argument("--ttl", type=parse_duration, default=parse_duration("8h"), help="e.g. 8h (default)")
    create.add_argument("--kind", choices=["bearer", "mtls"], default="bearer")
    create.add_argument("--fingerprint", help="mtls: SHA-256 fingerprint of the client certificate")
    create.add_argument("--token-out", type=Path, help="write the bearer token here (0600), not to stdout")

    listing = actions.add_parser("list", parents=[common], help="list agent sessions")
    listing.add_argument("--agent")

    show = actions.add_parser("show", parents=[common], help="show one agent session and its credentials")
    show.add_argument("agent_session_id")

    revoke = actions.add_parser(
        "revoke", parents=[common], help="revoke an agent session, cutting live sessions"
    )
    revoke.add_argument("agent_session_id")
    revoke.add_argument("--by", default=None, help="who revokes (default: the local user name)")
    revoke.add_argument("--reason", default="")

    renew = actions.add_parser(
        "renew", parents=[common], help="replace a credential; the old one stops working"
    )
    renew.add_argument("agent_session_id")
    renew.add_argument("--credential-id", help="needed only when several credentials are current")
    renew.add_argument("--fingerprint", help="mtls: the new certificate's SHA-256 fingerprint")
    renew.add_argument("--token-out", type=Path, help="write the new bearer token here (0600)")


def run_agent_session(
    args: argparse.Namespace,
    *,
    http: httpx.Client | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Run one ``agent-session`` action; returns the exit status. ``http`` replaces the client in tests."""
    import httpx

    try:
        admin_token = _read_secret(args.admin_token_file, "admin token")
        base = str(args.url).rstrip("/").removesuffix("/mcp")
        method, path, body = _request_for(args)
        if getattr(args, "token_out", None) is not None:
            _check_writable(args.token_out)
    except _Unusable as exc:
        print(f"bastion: {exc}", file=err)
        return 2
    headers = {"Authorization": f"Bearer {admin_token}"}
    try:
        if http is None:
            with httpx.Client(timeout=args.timeout) as client:
                response = client.request(
                    method, base + path, json=body, headers=headers, params=_params(args)
                )
        else:
            response = http.request(method, base + path, json=body, headers=headers, params=_params(args))
    except httpx.HTTPError as exc:
        print(f"bastion: cannot reach the admin API at {base}: {type(exc).__name__}", file=err)
        return 1
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        print(f"bastion: the admin API answered {response.status_code} without JSON", file=err)
        return 1
    if response.status_code >= 400 and "agent_session" not in answer:
        error = answer.get("error") or {}
        print(f"bastion: {error.get('reason', response.status_code)}: {error.get('message', '')}", file=err)
        return 1
    return _print_answer(args, answer, response.status_code, out, err)


def _request_for(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    action = args.agent_session_action
    if action == "create":
        if (args.kind == "mtls") != (args.fingerprint is not None):
            raise _Unusable("--fingerprint is required with --kind mtls, and only with it")
        if args.kind == "mtls" and args.token_out is not None:
            raise _Unusable("--token-out is for bearer credentials")
        body: dict[str, Any] = {
            "human": args.human,
            "agent": args.agent,
            "team": args.team,
            "scopes": list(args.scopes),
            "ttl_s": args.ttl,
            "credential_kind": args.kind,
        }
        if args.fingerprint is not None:
            body["certificate_fingerprint"] = args.fingerprint
        return "POST", "/admin/agent-sessions", body
    if action == "list":
        return "GET", "/admin/agent-sessions", None
    session_path = "/admin/agent-sessions/" + _path_segment(args.agent_session_id)
    if action == "show":
        return "GET", session_path, None
    if action == "revoke":
        return "POST", session_path + "/revoke", {"by": args.by or getpass.getuser(), "reason": args.reason}
    if action == "renew":
        renew: dict[str, Any] = {}
        if args.credential_id is not None:
            renew["credential_id"] = args.credential_id
        if args.fingerprint is not None:
            renew["certificate_fingerprint"] = args.fingerprint
        return "POST", session_path + "/renew", renew
    raise _Unusable(f"unknown action {action!r}")  # pragma: no cover - argparse enforces the choices


def _params(args: argparse.Namespace) -> dict[str, str]:
    agent = getattr(args, "agent", None) if args.agent_session_action == "list" else None
    return {} if agent is None else {"agent": agent}


def _print_answer(
    args: argparse.Namespace, answer: dict[str, Any], status: int, out: TextIO, err: TextIO
) -> int:
    token = answer.pop("token", None)
    if token is not None and args.token_out is not None:
        _write_secret(args.token_out, token)
        print(f"token written to {args.token_out}", file=err)
        token = None
    if args.as_json:
        if token is not None:
            answer["token"] = token
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    else:
        _print_table(args.agent_session_action, answer, token, out)
    if status >= 400:
        error = answer.get("error") or {}
        print(f"bastion: {error.get('reason', status)}: {error.get('message', '')}", file=err)
        return 1
    return 0


def _print_table(action: str, answer: dict[str, Any], token: str | None, out: TextIO) -> None:
    if action == "list":
        _rows(out, _LIST_COLUMNS, answer.get("agent_sessions", []))
        return
    if "agent_session" in answer:
        session = dict(answer["agent_session"])
        session["scopes"] = ",".join(session.get("scopes") or [])
        _pairs(out, session)
    if action == "create" and "credential" in answer:
        _pairs(out, {"credential_id": answer["credential"]["credential_id"]})
    if action == "renew":
        _pairs(out, {**answer["credential"], "superseded": answer.get("superseded")})
    if action == "show":
        print(file=out)
        _rows(out, _CREDENTIAL_COLUMNS, answer.get("credentials", []))
    if action == "revoke":
        _pairs(
            out, {"already_revoked": answer.get("already_revoked"), "ended": json.dumps(answer.get("ended"))}
        )
    if token is not None:
        _pairs(out, {"token": token})


def _pairs(out: TextIO, values: dict[str, Any]) -> None:
    width = max((len(k) for k in values), default=0)
    for key, value in values.items():
        print(f"{key.ljust(width)}  {'-' if value is None else value}", file=out)


def _rows(out: TextIO, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    cells = [[str(c).upper() for c in columns]]
    cells += [["-" if row.get(c) is None else str(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _path_segment(value: str) -> str:
    if not value or "/" in value or value in (".", ".."):
        raise _Unusable(f"not an agent session id: {value!r}")
    return value


def _check_writable(path: Path) -> None:
    if not path.parent.is_dir():
        raise _Unusable(f"cannot write {path}: no such directory")


def _write_secret(path: Path, secret: str) -> None:
    # Created 0600 before any byte is written; replaced atomically so a reader
    # (``bastion connect``) sees the old token or the new one, never half.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secret + "\n")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
