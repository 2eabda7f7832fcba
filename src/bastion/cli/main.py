"""The ``bastion`` command line: the one place that prints and exits (STYLE "The CLI is the edge").

``bastion serve`` runs the gateway. Without ``--config`` it serves the bundled
demo: the example stdio notes server, and the example Streamable HTTP tools
server that it starts itself, on the embedded store under ``--data-dir``,
with a demo agent token written to ``<data-dir>/demo-agent.token`` (0600).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bastion import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bastion", description="A fail-closed gateway for MCP.")
    parser.add_argument("--version", action="version", version=f"bastion {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, help="TOML configuration (default: the bundled demo)")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; off loopback needs gateway.allowed_hosts)",
    )
    serve.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765; 0: any free)")
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".bastion"),
        help="signing keys, the SQLite store and the demo's files (default .bastion, created 0700)",
    )
    serve.add_argument(
        "--store", help="a postgresql:// URL (default: $BASTION_STORE, [store] url, or <data-dir>/bastion.db)"
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="JSON log lines on stderr from this level up (default info)",
    )
    serve.add_argument("--generation", default="gateway-0", help="this replica's slot (unique per replica)")
    serve.add_argument("--unsafe-no-audit", action="store_true", help="benchmarks only: no audit chain")
    serve.add_argument(
        "--discard-store-and-start-empty",
        action="store_true",
        help="a used data directory whose store file is missing or empty starts a new, empty store"
        " (its execution history, chains and claims are gone); without it such a start is refused",
    )
    serve.add_argument(
        "--lease-s", type=float, default=10.0, help="worker lease: a silent holder loses its slot"
    )
    serve.add_argument("--heartbeat-s", type=float, default=2.0, help="heartbeat interval (below the lease)")
    serve.add_argument(
        "--evidence-max-entries",
        type=int,
        default=10_000,
        help="entries per evidence session, genesis and close included (at least 6)",
    )
    serve.add_argument(
        "--evidence-max-age-s",
        type=float,
        default=3600.0,
        help="... or at this age in seconds, whichever comes first (default 3600)",
    )
    serve.add_argument(
        "--sessionless-evidence-max-age-s",
        type=float,
        default=60.0,
        help="age bound of the evidence session sessionless requests share (its claim comes this soon)",
    )

    check = sub.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("config", type=Path)

    verify = sub.add_parser("verify", help="verify an exported audit bundle (and its claim) offline")
    verify.add_argument("bundle", type=Path, help="JSON Lines bundle from /audit/export")
    evidence = verify.add_mutually_exclusive_group()
    evidence.add_argument(
        "--claim", type=Path, help="the session's TRACE claim (from /sessions/{id}/trace-claim)"
    )
    evidence.add_argument(
        "--integrity-only",
        action="store_true",
        help="without a claim: check the chain's integrity only (nothing is authenticated)",
    )
    verify.add_argument("--key", type=Path, required=True, help="the gateway's public key (PEM or JWK)")
    verify.add_argument(
        "--jobs", type=int, default=None, help="processes to verify with (default: one per CPU)"
    )

    keys = sub.add_parser(
        "verify-keys", help="check a published key set (/.well-known/bastion-keys.json) against a pinned key"
    )
    keys.add_argument("document", type=Path, help="the key set document")
    keys.add_argument("--key", type=Path, required=True, help="the pinned public key (PEM or JWK)")
    keys.add_argument("--out", type=Path, help="write every key it vouches for here as <kid>.pem")

    audit = sub.add_parser("audit", help="offline audit tools")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    join = audit_sub.add_parser("join", help="records across bundles that share one execution_id, in order")
    join.add_argument("--execution-id", required=True)
    join.add_argument("--agent", help="only this agent's records (an execution_id is scoped per agent)")
    join.add_argument("bundles", type=Path, nargs="+")
    find = audit_sub.add_parser(
        "find",
        help="every entry of one (agent, execution_id) in a gateway's store, in every evidence session",
    )
    find.add_argument("--execution-id", required=True)
    find.add_argument("--agent", help="only this agent's entries (an execution_id is scoped per agent)")
    find.add_argument("--data-dir", type=Path, default=Path(".bastion"))
    find.add_argument(
        "--store", help="a postgresql:// URL (default: $BASTION_STORE, or <data-dir>/bastion.db)"
    )
    find.add_argument("--export", type=Path, help="also write each evidence session's bundle and claim here")

    public_key = sub.add_parser("public-key", help="print the gateway's active public key (PEM, or --jwk)")
    public_key.add_argument("--data-dir", type=Path, default=Path(".bastion"))
    public_key.add_argument("--jwk", action="store_true")

    rotate = sub.add_parser(
        "rotate-key", help="make a new signing key active; old public keys stay for verification"
    )
    rotate.add_argument("--data-dir", type=Path, default=Path(".bastion"))

    token = sub.add_parser(
        "hash-token", help="print the SHA-256 of a token read from stdin, for agents.*.token_sha256"
    )
    token.set_defaults(command="hash-token")

    from bastion.cli.agent_session_cmd import add_agent_session_parser
    from bastion.cli.approvals_cmd import add_approvals_parser
    from bastion.cli.connect_cmd import add_connect_parser
    from bastion.cli.pin_cmd import add_pin_parser
    from bastion.cli.pins_cmd import add_pins_parser
    from bastion.cli.sessions_cmd import add_sessions_parser
    from bastion.cli.workers_cmd import add_workers_parser

    add_agent_session_parser(sub)
    add_connect_parser(sub)
    add_workers_parser(sub)
    add_sessions_parser(sub)
    add_approvals_parser(sub)
    add_pins_parser(sub)
    add_pin_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; output into a closed pipe (``bastion public-key | head``) ends it quietly."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull so the exit-time flush is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


def _run(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from bastion.cli.serve import run_serve

        return run_serve(
            args.config,
            args.host,
            args.port,
            args.data_dir,
            args.log_level,
            generation=args.generation,
            unsafe_no_audit=args.unsafe_no_audit,
            lease_s=args.lease_s,
            heartbeat_s=args.heartbeat_s,
            evidence_max_entries=args.evidence_max_entries,
            evidence_max_age_s=args.evidence_max_age_s,
            sessionless_evidence_max_age_s=args.sessionless_evidence_max_age_s,
            store=args.store,
            discard_store=args.discard_store_and_start_empty,
        )
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
    if args.command == "verify":
        from bastion.cli.verify_cmd import run_verify

        return run_verify(
            args.bundle, args.claim, args.key, jobs=args.jobs, integrity_only=args.integrity_only
        )
    if args.command == "verify-keys":
        from bastion.cli.keys_cmd import run_verify_keys

        return run_verify_keys(args.document, args.key, out_dir=args.out)
    if args.command == "audit" and args.audit_command == "find":
        from bastion.cli.audit_find_cmd import run_find

        return run_find(
            args.data_dir, args.execution_id, agent=args.agent, export_dir=args.export, store_url=args.store
        )
    if args.command == "audit":
        from bastion.cli.verify_cmd import run_join

        return run_join(args.execution_id, args.bundles, agent=args.agent)
    if args.command == "public-key":
        import json

        from bastion.crypto.keys import Keyring

        if not (args.data_dir / "keys").exists():
            print(f"bastion: no signing key under {args.data_dir}", file=sys.stderr)
            return 2
        active = Keyring.open(args.data_dir).active
        print(json.dumps(active.to_jwk()) if args.jwk else active.to_pem().decode().rstrip())
        return 0
    if args.command == "rotate-key":
        from bastion.crypto.keys import Keyring

        if not (args.data_dir / "keys").exists():
            print(f"bastion: no signing key under {args.data_dir}", file=sys.stderr)
            return 2
        keyring = Keyring.open(args.data_dir)
        old = keyring.key_id
        new = keyring.rotate()
        print(f"active key: {new} (was {old}; restart the gateway to sign with it)")
        print(f"key set {args.data_dir / 'keys' / 'bastion-keys.json'} re-signed by both keys")
        return 0
    if args.command == "hash-token":
        from bastion.auth.bearer import hash_token

        token = sys.stdin.readline().strip()
        if not token:
            print(
                "bastion: hash-token read no token on stdin; pipe one in: bastion hash-token < token.file",
                file=sys.stderr,
            )
            return 2
        print(hash_token(token))
        return 0
    if args.command == "agent-session":
        from bastion.cli.agent_session_cmd import run_agent_session

        return run_agent_session(args)
    if args.command == "connect":
        from bastion.cli.connect_cmd import run_connect

        return run_connect(args)
    if args.command == "workers":
        from bastion.cli.workers_cmd import run_workers

        return run_workers(args)
    if args.command == "sessions":
        from bastion.cli.sessions_cmd import run_sessions

        return run_sessions(args)
    if args.command == "approvals":
        from bastion.cli.approvals_cmd import run_approvals

        return run_approvals(args)
    if args.command == "pins":
        from bastion.cli.pins_cmd import run_pins

        return run_pins(args)
    if args.command == "pin":
        from bastion.cli.pin_cmd import run_pin

        return run_pin(args)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
