"""``bastion connect --url URL --credential FILE``: the local stdio adapter (issue #4 item 6).

For MCP clients that only launch stdio servers: this process speaks MCP on
its stdin/stdout and Streamable HTTP to the gateway, with the bearer token
read from ``FILE`` (re-read when it is renewed). Logs go to stderr as JSON
lines, never with the credential. Exit status: 0 when the client closed
stdin, 2 when the credential file holds no token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_connect_parser", "run_connect"]


def add_connect_parser(subparsers: Any) -> None:
    """Register ``connect`` on the ``bastion`` subparsers."""
    connect = subparsers.add_parser("connect", help="relay a local stdio MCP client to the gateway")
    connect.add_argument(
        "--url", required=True, help="the gateway's MCP endpoint, e.g. http://127.0.0.1:8765/mcp"
    )
    connect.add_argument("--credential", type=Path, required=True, help="file holding the bearer token")
    connect.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def run_connect(args: argparse.Namespace) -> int:
    import anyio

    from bastion.logs import configure_logging
    from bastion.transport.stdio_adapter import CredentialUnavailable, connect_stdio

    configure_logging(args.log_level)
    try:
        anyio.run(connect_stdio, args.url, args.credential)
    except CredentialUnavailable as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
