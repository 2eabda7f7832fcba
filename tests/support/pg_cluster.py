"""A throwaway PostgreSQL cluster in a temporary directory (for tests and benchmarks).

:meth:`ThrowawayCluster.start` runs Debian's ``initdb`` and ``pg_ctl`` (found
through ``pg_config --bindir``, ``$BASTION_PG_BINDIR`` or
``/usr/lib/postgresql/*/bin``) on a cluster that listens only on a Unix
socket inside its own directory: no TCP port, no system service, nothing to
collide with another run. ``initdb`` refuses to run as root, so as root the
server runs as the ``postgres`` system user (created when missing). Nothing
here is needed by the gateway itself.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["PostgresUnavailable", "ThrowawayCluster", "find_bindir"]

_SERVER_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server programs are not installed (or cannot run here)."""


def find_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``; raises :class:`PostgresUnavailable`."""
    candidates: list[str] = []
    if os.environ.get("BASTION_PG_BINDIR"):
        candidates.append(os.environ["BASTION_PG_BINDIR"])
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if found.returncode == 0:
            candidates.append(found.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major, reverse=True)
    for candidate in candidates:
        if all((Path(candidate) / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return Path(candidate)
    raise PostgresUnavailable("no PostgreSQL server programs (initdb, pg_ctl) found; install postgresql")


def _major(path: str) -> int:
    version = Path(path).parent.name
    return int(version) if version.isdigit() else 0


class ThrowawayCluster:
    """One running cluster; :meth:`stop` ends it and deletes its directory."""

    def __init__(self, bindir: Path, root: Path, run_as: Sequence[str]) -> None:
        """Private: use :meth:`start`."""
        self.bindir = bindir
        self.root = root
        self._run_as = list(run_as)
        self._admin: psycopg.Connection[Any] | None = None

    @classmethod
    def start(cls, *, durable: bool = False, max_connections: int = 300) -> ThrowawayCluster:
        """Create and start a cluster. ``durable=False`` turns ``fsync`` off (tests only, never a gateway)."""
        bindir = find_bindir()
        # Under /tmp, not $TMPDIR: the server user must reach it, and a Unix socket path is short.
        # mkdtemp makes a fresh private directory there, so a shared /tmp is safe.
        parent = "/tmp" if os.path.isdir("/tmp") else None
        root = Path(tempfile.mkdtemp(prefix="bastion-pg-", dir=parent))
        run_as: list[str] = []
        if os.geteuid() == 0:
            uid, gid = _server_user()
            os.chown(root, uid, gid)
            run_as = ["runuser", "-u", _SERVER_USER, "--"] if shutil.which("runuser") else []
            if not run_as:
                run_as = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        cluster = cls(bindir, root, run_as)
        try:
            cluster._run("initdb", "-D", str(root / "data"), "-A", "trust", "-U", _SERVER_USER,
                         "-E", "UTF8", "--locale=C", "--no-sync")  # fmt: skip
            settings = [
                "listen_addresses=''",
                f"unix_socket_directories='{root}'",
                f"max_connections={max_connections}",
                f"fsync={'on' if durable else 'off'}",
                f"synchronous_commit={'on' if durable else 'off'}",
                f"full_page_writes={'on' if durable else 'off'}",
            ]
            with open(root / "data" / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
                conf.write("".join(line.replace("=", " = ", 1) + "\n" for line in settings))
            cluster._run("pg_ctl", "-D", str(root / "data"), "-l", str(root / "server.log"), "-w", "start")
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def dsn(self, database: str = "postgres") -> str:
        """A libpq URL for ``database`` over the cluster's Unix socket."""
        return f"postgresql:///{database}?host={self.root}&user={_SERVER_USER}"

    def create_schema(self, name: str) -> str:
        """Create schema ``name`` (letters, digits, ``_``) and return a URL whose ``search_path`` is it.

        A schema is far cheaper than a database (no copy, no checkpoint): one
        per test keeps tests apart at the cost of a few milliseconds.
        """
        self.psql(f"CREATE SCHEMA {_identifier(name)}")
        return self.dsn() + f"&options=-csearch_path%3D{name}"

    def drop_schema(self, name: str) -> None:
        self.psql(f"DROP SCHEMA IF EXISTS {_identifier(name)} CASCADE")

    def psql(self, sql: str) -> None:
        """Run one SQL command as the superuser, on a connection kept for the cluster's life."""
        if self._admin is None:
            self._admin = psycopg.connect(self.dsn(), autocommit=True)
        self._admin.execute(sql)

    def halt(self) -> None:
        """Stop the server at once (``-m immediate``), keeping the cluster: a store outage (issue #23)."""
        self._forget_admin()
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")

    def resume(self) -> None:
        """Start the halted server again (same data, same socket)."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"), "-w", "start")

    def require_password(self, role: str, password: str) -> str:
        """Create login role ``role`` that must give ``password`` (SCRAM) and return its URL.

        Every other role keeps trust; ``role`` alone is checked, from now on (``pg_hba.conf`` is
        read again). Change the password with :meth:`psql` (``ALTER ROLE``).
        """
        name = _identifier(role)
        self.psql(f"CREATE ROLE {name} LOGIN SUPERUSER PASSWORD '{password}'")
        hba = self.root / "data" / "pg_hba.conf"
        hba.write_text(f"local all {name} scram-sha-256\n" + hba.read_text())
        self.psql("SELECT pg_reload_conf()")
        return f"postgresql://{name}:{password}@/postgres?host={self.root}"

    def _forget_admin(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(psycopg.Error):
                self._admin.close()
            self._admin = None

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if (self.root / "data" / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        done = subprocess.run(
            [*self._run_as, str(self.bindir / program), *args],
            capture_output=True, text=True, check=False, timeout=120, cwd=self.root,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise PostgresUnavailable(f"{program} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def _server_user() -> tuple[int, int]:
    """The uid and gid of the ``postgres`` system user, creating it when missing (as root)."""
    try:
        entry = pwd.getpwnam(_SERVER_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _SERVER_USER],
            check=True, capture_output=True,
        )  # fmt: skip
        entry = pwd.getpwnam(_SERVER_USER)
    return entry.pw_uid, entry.pw_gid


def _identifier(name: str) -> str:
    if not name.replace("_", "").isalnum() or not name[:1].isalpha():
        raise ValueError("a throwaway schema name is a letter, then letters, digits and _")
    return name
