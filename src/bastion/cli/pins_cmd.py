"""``bastion pins list|show|approve|reject``: changed definitions, as an operator decides them (issue 27).

Talks to a running gateway's admin API (``--url`` with the admin credential from
``--admin-token-file``): ``/admin/pins``, ``/admin/pins/show``,
``/admin/pins/approve``, ``/admin/pins/reject``. ``show`` prints both digests
and a unified diff of the pinned and the offered definition. A definition is
the upstream's text: it is printed as JSON with every non-ASCII and control
character escaped, so nothing it holds can drive the terminal. ``approve`` and
``reject`` name the offered digest ``show`` printed: a newer offer since is
refused (``conflict``). Exit status: 0 done, 1 refused or unreachable, 2
unusable arguments or files.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlencode

from bastion.cli.admin_http import AdminArgumentsUnusable, admin_get, admin_post, print_table

if TYPE_CHECKING:
    import httpx

__all__ = ["PIN_COLUMNS", "add_pins_parser", "escaped_json", "run_pins"]

PIN_COLUMNS = ("server", "kind", "name", "pinned", "offer", "offered")
_KINDS = ("tool", "prompt", "resource_template")


def add_pins_parser(subparsers: Any) -> None:
    """Register ``pins list|show|approve|reject`` on the ``bastion`` subparsers."""
    parser = subparsers.add_parser("pins", help="pinned definitions and changes waiting for a decision")
    actions = parser.add_subparsers(dest="pins_action", required=True)
    for action, help_text in (
        ("list", "every pin, and the changed definitions offered against them"),
        ("show", "one pin: both digests and a diff of the pinned and the offered definition"),
        ("approve", "pin the offered definition (every replica serves it)"),
        ("reject", "keep the pin; the offered definition stays withheld"),
    ):
        sub = actions.add_parser(action, help=help_text)
        sub.add_argument("--url", required=True, help="a running gateway, e.g. http://127.0.0.1:8765")
        sub.add_argument("--admin-token-file", type=Path, required=True, help="file holding the admin token")
        sub.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
        sub.add_argument("--json", action="store_true", dest="as_json", help="print the API's JSON")
        if action == "list":
            sub.add_argument("--server", help="only this server's pins")
            continue
        sub.add_argument("--server", required=True)
        sub.add_argument("--kind", choices=_KINDS, default="tool")
        sub.add_argument("--name", required=True, help="the upstream's own name (no namespace prefix)")
        if action in ("approve", "reject"):
            sub.add_argument("--digest", required=True, help="the offered digest `bastion pins show` printed")
            sub.add_argument("--by", required=True, help="who decides (recorded and audited)")


def run_pins(
    args: argparse.Namespace,
    *,
    http: httpx.Client | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``bastion pins ...``; returns the exit status. ``http`` replaces the client in tests."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    action = str(args.pins_action)
    url, token = str(args.url), args.admin_token_file
    try:
        if action == "list":
            query = "?" + urlencode({"server": args.server}) if args.server else ""
            answer = admin_get(url, token, "/admin/pins" + query, timeout=args.timeout, http=http, err=err)
        elif action == "show":
            query = urlencode({"server": args.server, "kind": args.kind, "name": args.name})
            answer = admin_get(
                url, token, "/admin/pins/show?" + query, timeout=args.timeout, http=http, err=err
            )
        else:
            body = {
                "server": args.server, "kind": args.kind, "name": args.name,
                "digest": args.digest, "by": args.by,
            }  # fmt: skip
            answer = admin_post(
                url, token, f"/admin/pins/{action}", body, timeout=args.timeout, http=http, err=err
            )
    except AdminArgumentsUnusable as exc:
        print(f"bastion: {exc}", file=err)
        return 2
    if answer is None:
        return 1
    if args.as_json:
        print(escaped_json(answer), file=out)
    elif action == "list":
        pins = answer.get("pins", [])
        if not pins:
            print("no pins yet", file=out)
        else:
            print_table(PIN_COLUMNS, [_row(p) for p in pins], out)
    elif action == "show":
        _show(answer, out)
    else:
        what = " ".join(_cell(answer.get(key)) for key in ("server", "kind", "name"))
        print(f"{action}d {what}: pinned {_cell(answer.get('digest'))}", file=out)
    return 0


def escaped_json(value: Any) -> str:
    """``value`` as indented JSON, every non-ASCII and control character escaped (terminal-safe)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True)


def _cell(value: Any) -> str:
    # One line, escaped: a name or digest from the store is shown, never interpreted.
    return json.dumps(value, ensure_ascii=True).strip('"') if isinstance(value, str) else str(value)


def _row(pin: dict[str, Any]) -> list[str]:
    offer = pin.get("offer") or {}
    return [
        _cell(pin.get("server")),
        _cell(pin.get("kind")),
        _cell(pin.get("name")),
        _cell(pin.get("digest"))[:12],
        _cell(offer.get("state")) if offer else "-",
        _cell(offer.get("digest"))[:12] if offer else "-",
    ]


def _show(pin: dict[str, Any], out: TextIO) -> None:
    offer = pin.get("offer") or None
    print(f"{_cell(pin.get('server'))} {_cell(pin.get('kind'))} {_cell(pin.get('name'))}", file=out)
    pinned = f"pinned   {_cell(pin.get('digest'))}  by {_cell(pin.get('pinned_by'))}"
    print(f"{pinned} at {_cell(pin.get('pinned_at'))}", file=out)
    if offer is None:
        print("no changed definition is offered", file=out)
        print(escaped_json(pin.get("definition")), file=out)
        return
    offered = f"offered  {_cell(offer.get('digest'))}  {_cell(offer.get('state'))}"
    print(f"{offered} at {_cell(offer.get('offered_at'))}", file=out)
    before = escaped_json(pin.get("definition")).splitlines()
    after = escaped_json(offer.get("definition")).splitlines()
    for line in difflib.unified_diff(before, after, "pinned", "offered", lineterm=""):
        print(line, file=out)
