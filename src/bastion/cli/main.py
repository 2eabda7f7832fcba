"""The ``bastion`` command line: the one place that prints and exits (STYLE "The CLI is the edge").

``bastion serve`` runs the gateway. Without ``--config`` it serves the bundled
demo: the example stdio notes server, and the example Streamable HTTP tools
server that it starts itself, on the embedded store under ``--data-dir``,
with a demo agent token written to ``<data-dir>/demo-agent.token`` (0600).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bastion", description="A fail-closed gateway for MCP.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, help="TOML configuration (default: the bundled demo)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--data-dir", type=Path, default=Path(".bastion"))
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    check = sub.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("config", type=Path)

    token = sub.add_parser(
        "hash-token", help="print the SHA-256 of a token read from stdin, for agents.*.token_sha256"
    )
    token.set_defaults(command="hash-token")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from bastion.cli.serve import run_serve

        return run_serve(args.config, args.host, args.port, args.data_dir, args.log_level)
    if args.command == "check-config":
        from bastion.errors import ConfigError
        from bastion.policy.load import load_snapshot

        try:
            snapshot = load_snapshot(args.config)
        except ConfigError as exc:
            print(f"bastion: {exc.message}", file=sys.stderr)
            return 2
        print(f"ok: {args.config} (version {snapshot.version}, {len(snapshot.servers)} servers)")
        return 0
    if args.command == "hash-token":
        from bastion.auth.bearer import hash_token

        print(hash_token(sys.stdin.readline().strip()))
        return 0
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
