"""Run the gateway as ``bastion serve`` does, with a store that kills the process at a chosen step.

``python -m tests.support.crash_gateway --config PATH --data-dir DIR --port 0
--kill-after OP [--kill-execution-id ID] [--lease-s 1]`` loads the TOML
configuration and serves it with ``bastion serve``'s own serving loop on the
embedded store, so it prints ``BASTION READY <url>`` once it accepts
connections. With ``--kill-after`` the store is a
:class:`~tests.support.crash_store.CrashingStore`, so the process ``kill -9``\\s
itself at that step of the first matching execution; without it, the gateway
runs normally, which is how a test restarts it on the same data dir.

The lease is short (1 s by default, heartbeat every 0.3 s) so a restart takes
the dead worker's generation over quickly and runs recovery (DESIGN section 3).
This is a test fixture and a program of its own: the one line it prints is its
readiness protocol. Never use it outside tests.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from bastion.cli.serve import _serve as serve_gateway
from bastion.errors import ConfigError
from bastion.gateway import RuntimeOptions
from bastion.logs import configure_logging
from bastion.policy.load import load_snapshot
from bastion.store.base import Store
from tests.support.crash_store import CrashingStore, parse_kill_point

__all__ = ["main"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.support.crash_gateway", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="TOML configuration")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--kill-after", help="e.g. reserve_execution, mark_invoking, before:record_outcome")
    parser.add_argument("--kill-execution-id", help="only this execution id triggers the kill")
    parser.add_argument("--lease-s", type=float, default=1.0)
    parser.add_argument("--heartbeat-s", type=float, default=None, help="default: lease / 3")
    parser.add_argument("--sessionless-evidence-max-age-s", type=float, default=60.0)
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    if args.kill_after is not None:
        try:
            parse_kill_point(args.kill_after)
        except ValueError as exc:
            parser.error(str(exc))
    return args


def _options(args: argparse.Namespace) -> RuntimeOptions:
    factory: Callable[[Store], Store] | None = None
    if args.kill_after is not None:
        kill_after: str = args.kill_after
        execution_id: str | None = args.kill_execution_id

        def factory(inner: Store) -> Store:
            return CrashingStore(inner, kill_after, execution_id=execution_id)

    heartbeat_s = args.heartbeat_s if args.heartbeat_s is not None else args.lease_s / 3
    return RuntimeOptions(
        data_dir=args.data_dir,
        lease_s=args.lease_s,
        heartbeat_s=heartbeat_s,
        store_factory=factory,
        sessionless_evidence_max_age_s=args.sessionless_evidence_max_age_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    configure_logging(args.log_level)
    args.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        snapshot = load_snapshot(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"crash_gateway: {exc.message}\n")
        return 2
    # The very serving loop of `bastion serve` (uvicorn settings, readiness line, SIGHUP reload).
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(
            serve_gateway,
            snapshot,
            args.host,
            args.port,
            _options(args),
            None,
            backend_options={"use_uvloop": True},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
