"""Three ``bastion serve`` processes on one store, behind the nginx of ``deploy/`` (issue #10).

The replicas are real processes (``tests/e2e/test_workers_e2e.gateway_process``:
generations ``gateway-1..3``, one data dir, a 1 s lease). nginx runs as a
foreground child with a temporary prefix, on the very configuration file that
``deploy/nginx/bastion.conf`` ships, with only its addresses rewritten to the
loopback ports of this test: the replicas' ports, the listening port and the
access log (whose ``upstream=`` field says which replica served a request).
"""

from __future__ import annotations

import contextlib
import re
import socket
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import psycopg
import pytest

from bastion.auth.bearer import hash_token
from tests.e2e.conftest import TOKENS
from tests.e2e.issue4_support import auth_table, toml_dumps
from tests.e2e.test_workers_e2e import REPO, GatewayProcess, _stop, gateway_process
from tests.support.nginx import NGINX, main_config

__all__ = ["NGINX", "Fleet", "replica_fleet", "write_fleet_config"]

DEPLOY_CONF = REPO / "deploy" / "nginx" / "bastion.conf"
START_TIMEOUT_S = 30.0


def write_fleet_config(path: Path, upstream_url: str, **gateway: Any) -> Path:
    """One HTTP upstream ``work``, the static agents alice and bob, and the admin/auditor credentials."""
    config = {
        # nginx passes the client's Host (its own port); the tests also reach replicas directly.
        "gateway": {
            "upstream_timeout_s": 60.0,
            "allowed_hosts": ["127.0.0.1:*"],
            **gateway,
        },
        "servers": {"work": {"url": upstream_url}},
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
        "auth": auth_table(),
    }
    path.write_text(toml_dumps(config))
    return path


@dataclass
class Fleet:
    """The three replicas (index 0..2 are generations gateway-1..3) and nginx in front of them."""

    replicas: list[GatewayProcess]
    url: str  # nginx's /mcp
    access_log: Path
    data_dir: Path
    store_url: str | None  # PostgreSQL; None: the SQLite file in data_dir

    def rows(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of ``query`` (``?`` placeholders) from the shared store, read outside the gateways."""
        if self.store_url is not None:
            with psycopg.connect(self.store_url, autocommit=True) as conn:
                return [tuple(r) for r in conn.execute(query.replace("?", "%s"), args).fetchall()]
        conn = sqlite3.connect(f"file:{self.data_dir / 'bastion.db'}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(query, args).fetchall()
        finally:
            conn.close()

    def served_by(self) -> list[str]:
        """The replica address of every proxied request so far, in order (from nginx's access log)."""
        if not self.access_log.exists():
            return []
        return re.findall(r"upstream=(\S+)", self.access_log.read_text())

    def replica_index(self, address: str) -> int:
        origins = [r.origin.removeprefix("http://") for r in self.replicas]
        return origins.index(address)

    def spread(self) -> Counter[int]:
        """How many proxied requests each replica served (by index); retried requests count each try."""
        counts: Counter[int] = Counter()
        for addresses in self.served_by():
            for address in addresses.split(","):
                address = address.strip()
                if address and address[0].isdigit():
                    counts[self.replica_index(address)] += 1
        return counts


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def nginx_config(prefix: Path, replica_ports: list[int], listen_port: int) -> Path:
    """``deploy/nginx/bastion.conf`` with this test's addresses, inside a main file of its own."""
    site = DEPLOY_CONF.read_text()
    for n, port in enumerate(replica_ports, start=1):
        site = site.replace(f"127.0.0.1:870{n}", f"127.0.0.1:{port}")
    site = site.replace("listen 127.0.0.1:8700;", f"listen 127.0.0.1:{listen_port};")
    site = site.replace("/var/log/nginx/bastion.access.log", str(prefix / "logs" / "access.log"))
    assert site.count(f"127.0.0.1:{listen_port}") == 1, "the deploy file's listen line moved"
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    (prefix / "bastion.conf").write_text(site)
    return main_config(prefix, f"    include {prefix / 'bastion.conf'};\n")


async def _until_listening(port: int, process: anyio.abc.Process, error_log: Path) -> None:
    with anyio.fail_after(START_TIMEOUT_S):
        while True:
            if process.returncode is not None:
                detail = error_log.read_text() if error_log.exists() else ""
                raise AssertionError(f"nginx exited ({process.returncode}):\n{detail}")
            with contextlib.suppress(OSError):
                stream = await anyio.connect_tcp("127.0.0.1", port)
                await stream.aclose()
                return
            await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def replica_fleet(tmp_path: Path, config: Path, store_url: str | None) -> AsyncIterator[Fleet]:
    """Three replicas on one store and nginx in front; everything stopped on exit.

    The replicas find a PostgreSQL ``store_url`` in ``BASTION_STORE`` (the caller sets it in the
    environment they inherit); without one they share the SQLite file of one data dir.
    """
    if NGINX is None:
        pytest.fail("nginx is not installed (.ci/run installs Debian's nginx)")
    data_dir = tmp_path / "data"
    async with contextlib.AsyncExitStack() as stack:
        replicas = []
        for n in (1, 2, 3):
            replica = await stack.enter_async_context(
                gateway_process(config, data_dir, f"gateway-{n}", tmp_path / f"replica-{n}.log")
            )
            replicas.append(replica)
        ports = [int(r.origin.rsplit(":", 1)[1]) for r in replicas]
        listen = _free_port()
        prefix = tmp_path / "nginx"
        conf = nginx_config(prefix, ports, listen)
        nginx = await anyio.open_process([NGINX, "-p", str(prefix), "-c", str(conf)], cwd=prefix)
        stack.push_async_callback(_stop, nginx)
        await _until_listening(listen, nginx, prefix / "logs" / "error.log")
        access_log = prefix / "logs" / "access.log"
        yield Fleet(replicas, f"http://127.0.0.1:{listen}/mcp", access_log, data_dir, store_url)
