"""``bastion workers``: every worker identity, what it is and whether it is live (DESIGN section 6).

Reads a running gateway's ``GET /admin/workers`` (``--url`` with the admin
credential from ``--admin-token-file``), or the store file directly
(``--data-dir``; liveness then judged with the lease each worker's gateway
recorded at registration, or ``--lease-s`` when given).
Columns: identity, role, generation, epoch, liveness, heartbeat age, launch
provenance, owning sessions (from live attachment records only; ``unproven``
when none), cohort, and the policy version a gateway runs (``behind`` when it
is not the newest a live replica applied, or its last reload failed).
``--json`` prints the API's JSON. Exit status: 0 done, 1 refused or
unreachable, 2 unusable arguments or files.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bastion.cli.admin_http import AdminArgumentsUnusable, admin_get, print_table

if TYPE_CHECKING:
    import httpx

__all__ = ["COLUMNS", "add_workers_parser", "row_of", "run_workers"]

COLUMNS = (
    "identity",
    "role",
    "generation",
    "epoch",
    "liveness",
    "heartbeat_age",
    "provenance",
    "owning_sessions",
    "cohort",
    "policy",
)
_PROVENANCE_KEYS = ("started_by", "server", "pid", "host", "config_version", "supersedes")
_DEFAULT_LEASE_S = 10.0  # RuntimeOptions.lease_s


class _Unusable(Exception):
    """Arguments or files the command cannot use (exit 2)."""


def add_workers_parser(subparsers: Any) -> None:
    """Register ``workers`` on the ``bastion`` subparsers."""
    parser = subparsers.add_parser(
        "workers", help="list worker identities: generation, epoch, liveness, provenance, owners"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="a running gateway, e.g. http://127.0.0.1:8765 (needs the admin API)")
    source.add_argument("--data-dir", type=Path, help="read the store file under this directory instead")
    source.add_argument("--store", help="read this PostgreSQL store (a postgresql:// URL) instead")
    parser.add_argument("--admin-token-file", type=Path, help="with --url: file holding the admin token")
    parser.add_argument(
        "--lease-s",
        type=float,
        default=None,
        help="with --data-dir/--store: judge liveness with this lease (default: each worker's recorded one)",
    )
    parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")


def run_workers(
    args: argparse.Namespace,
    *,
    http: httpx.Client | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``bastion workers``; returns the exit status. ``http`` replaces the client in tests."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        if args.url is not None:
            answer = _from_admin_api(args, http, err)
            if answer is None:
                return 1
        else:
            answer = _from_store(args)
    except _Unusable as exc:
        print(f"bastion: {exc}", file=err)
        return 2
    if args.as_json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=out)
    else:
        _print_table(answer.get("workers", []), out)
    return 0


def _from_admin_api(
    args: argparse.Namespace, http: httpx.Client | None, err: TextIO
) -> dict[str, Any] | None:
    try:
        return admin_get(
            str(args.url), args.admin_token_file, "/admin/workers", timeout=args.timeout, http=http, err=err
        )
    except AdminArgumentsUnusable as exc:
        raise _Unusable(str(exc)) from None


def _from_store(args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    from bastion.errors import ConfigError, StoreError
    from bastion.store.select import SQLITE_FILE, choose_store_url, open_store
    from bastion.workers.liveness import pid_alive, this_host
    from bastion.workers.registry import describe_workers

    data_dir: Path = args.data_dir if args.data_dir is not None else Path(".")
    try:
        url = choose_store_url(getattr(args, "store", None), {})
    except ConfigError as exc:
        raise _Unusable(exc.message) from None
    if url is None and not (data_dir / SQLITE_FILE).is_file():  # never create a store where none is
        raise _Unusable(f"no store at {data_dir / SQLITE_FILE}")
    if args.lease_s is not None and not args.lease_s > 0:
        raise _Unusable("--lease-s must be positive")

    async def read() -> dict[str, Any]:
        now = datetime.now(UTC)
        try:
            store = await open_store(url, data_dir)
        except StoreError as exc:
            raise _Unusable(f"{exc.message} ({exc.data.get('store', data_dir / SQLITE_FILE)})") from None
        try:
            views = await describe_workers(
                store,
                now=now,
                lease_s=args.lease_s,
                pid_alive=pid_alive,
                this_host=this_host(),
                default_lease_s=_DEFAULT_LEASE_S,
            )
        finally:
            await store.aclose()
        return {
            "as_of": now.isoformat().replace("+00:00", "Z"),
            "lease_s": args.lease_s if args.lease_s is not None else "recorded",
            "workers": [v.to_json() for v in views],
        }

    return anyio.run(read)


def row_of(worker: dict[str, Any]) -> dict[str, str]:
    """One table row from one worker's JSON (as ``GET /admin/workers`` gives it)."""
    generation = worker.get("generation")
    if generation is not None and worker.get("superseded"):
        generation = f"{generation} (superseded)"
    provenance = worker.get("provenance") or {}
    owners = worker.get("owning_sessions")
    cohort = str(worker.get("cohort"))
    if worker.get("cohort_standing") == "duplicate":
        cohort += " duplicate"
    else:
        cohort += f" ({worker.get('cohort_live', 0)} live)"
    launched = " ".join(f"{k}={provenance[k]}" for k in _PROVENANCE_KEYS if provenance.get(k) is not None)
    return {
        "identity": str(worker.get("worker_id")),
        "role": str(worker.get("role")),
        "generation": "-" if generation is None else str(generation),
        "epoch": "-" if worker.get("epoch") is None else str(worker.get("epoch")),
        "liveness": str(worker.get("liveness")),
        "heartbeat_age": f"{float(worker.get('heartbeat_age_s') or 0.0):.1f}s",
        "provenance": launched or "unproven",
        "owning_sessions": owners if isinstance(owners, str) else ",".join(owners or []) or "unproven",
        "cohort": cohort,
        "policy": _policy_cell(worker),
    }


def _policy_cell(worker: dict[str, Any]) -> str:
    """A gateway's reported snapshot version, marked ``behind`` when it is not the fleet's newest (#10)."""
    version = worker.get("policy_version")
    if version is None:
        return "-"
    return f"{version} behind" if worker.get("policy_behind") else str(version)


def _print_table(workers: list[dict[str, Any]], out: TextIO) -> None:
    print_table(COLUMNS, [[row_of(w)[c] for c in COLUMNS] for w in workers], out)
