"""Debian's nginx as a pure reverse proxy in front of the upstream: the cost of one extra hop (issue 28).

``run.py --nginx`` measures it beside direct and Bastion in the same rounds,
so "Bastion ÷ nginx" says how far Bastion is from the physical limit of a
relay on this machine. The relay does no governance at all: HTTP/1.1 with
keepalive to the upstream, request and response buffering off (SSE passes
as it is written), one worker process (Bastion is one process too). Its
configuration is generated per run under the run's temp dir; nginx is found
on ``PATH`` or at ``/usr/sbin/nginx``, and installed from Debian's packages
when it is missing and this process may run ``apt-get``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import repo_path  # noqa: F401  (puts the repository root on sys.path: tests.support)
from procs import Child, free_port
from tests.support.nginx import main_config

__all__ = ["RelayUnavailable", "find_nginx", "nginx_config", "start_nginx_relay"]

_INSTALL_TIMEOUT_S = 900.0


class RelayUnavailable(Exception):
    """nginx is not installed and could not be installed here; the message says how to install it."""


def _installed() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def find_nginx(*, install: bool = True) -> str:
    """The nginx binary; with ``install``, Debian's package is installed first when it is missing."""
    found = _installed()
    if found:
        return found
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RelayUnavailable("nginx is not installed (as root: apt-get install -y nginx)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "nginx"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            raise RelayUnavailable(f"{' '.join(argv)} failed: {done.stderr.strip()[-300:]}")
    found = _installed()
    if found is None:
        raise RelayUnavailable("apt-get installed nginx, but no nginx binary was found")
    return found


def nginx_config(prefix: Path, upstream_url: str, listen_port: int) -> Path:
    """A main nginx.conf under ``prefix`` relaying 127.0.0.1:``listen_port`` to the upstream."""
    upstream = urlsplit(upstream_url)
    http = (
        "    access_log off;\n"
        "    upstream bench_upstream {\n"
        f"        server {upstream.hostname}:{upstream.port};\n"
        "        keepalive 64;\n"
        "        keepalive_requests 1000000;\n"
        "    }\n"
        "    server {\n"
        f"        listen 127.0.0.1:{listen_port};\n"
        "        keepalive_requests 1000000;\n"
        "        location / {\n"
        "            proxy_pass http://bench_upstream;\n"
        "            proxy_http_version 1.1;\n"
        '            proxy_set_header Connection "";\n'
        "            proxy_set_header Host $http_host;\n"
        "            proxy_buffering off;\n"
        "            proxy_request_buffering off;\n"
        "            proxy_cache off;\n"
        "            gzip off;\n"
        "            proxy_read_timeout 3600s;\n"
        "        }\n"
        "    }\n"
    )
    return main_config(prefix, http, worker_connections=4096)


def start_nginx_relay(temp: Path, upstream_url: str, timeout_s: float) -> tuple[Child, str]:
    """nginx relaying to ``upstream_url`` on a free port, and the relayed MCP endpoint URL."""
    binary = find_nginx()
    prefix = temp / "nginx"
    port = free_port()
    config = nginx_config(prefix, upstream_url, port)
    child = Child.start_listening(
        "nginx",
        [binary, "-p", str(prefix), "-c", str(config)],
        port=port,
        log_path=temp / "nginx.log",
        timeout_s=timeout_s,
    )
    path = urlsplit(upstream_url).path or "/"
    return child, f"http://127.0.0.1:{port}{path}"
