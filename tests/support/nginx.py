"""Debian's nginx run unprivileged-style under a prefix of its own: the tests' proxy and the bench's relay.

:func:`main_config` writes a main ``nginx.conf`` that keeps everything nginx
writes (pid, error log, temp files) under ``prefix``, runs in the foreground
with one worker, and wraps the ``http`` block the caller gives. As root the
worker stays root (``user root``), so it can read a prefix under a private
temp dir.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["NGINX", "main_config"]

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def main_config(prefix: Path, http_body: str, *, worker_connections: int = 1024) -> Path:
    """``prefix/nginx.conf``: a foreground nginx of one worker whose ``http`` block is ``http_body``."""
    logs = prefix / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    temp = "".join(
        f"    {name}_temp_path {prefix / name};\n"
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;\n" if os.geteuid() == 0 else ""
    text = (
        f"daemon off;\n{user}worker_processes 1;\npid {prefix / 'nginx.pid'};\n"
        f"error_log {logs / 'error.log'} warn;\n"
        f"events {{ worker_connections {worker_connections}; }}\n"
        f"http {{\n{temp}{http_body}}}\n"
    )
    path = prefix / "nginx.conf"
    path.write_text(text)
    return path
