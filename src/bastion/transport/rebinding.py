"""DNS-rebinding protection at the front door: ``Host`` and ``Origin`` (spec: Streamable HTTP, Security).

Follows the MCP SDK's transport-security model (allowed hosts, allowed
origins, ``host:*`` for any port), with fail-closed defaults:

- ``gateway.allowed_hosts`` empty (the default): a request that arrived on a
  loopback address may name ``localhost``, ``127.0.0.1`` or ``[::1]`` with the
  port it arrived on; a request that arrived on any other address is refused,
  so a non-loopback bind needs an explicit list.
- ``gateway.allowed_origins`` empty (the default): requests without an
  ``Origin`` pass (non-browser clients); on a loopback address the browser
  origins ``http://localhost:PORT``, ``http://127.0.0.1:PORT`` and
  ``http://[::1]:PORT`` pass too; anything else is refused.
- An explicit list replaces the default entirely.

The address a request arrived on is the ASGI ``server`` of its scope (the
listening socket's address under uvicorn), so the defaults follow the bind.
This module decides and raises; ``transport/streamable_http.py`` renders.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import Scope

from bastion.errors import HostForbidden, OriginForbidden

__all__ = ["check_host_and_origin", "is_loopback"]

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


@functools.lru_cache(maxsize=64)  # asked per request of the few addresses the gateway listens on
def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a name) means this machine only."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_host_and_origin(
    scope: Scope, headers: Headers, allowed_hosts: tuple[str, ...], allowed_origins: tuple[str, ...]
) -> None:
    """Refuse a request whose ``Host`` or ``Origin`` is not allowed.

    Raises:
        HostForbidden: the ``Host`` header is missing or not allowed (HTTP 421).
        OriginForbidden: an ``Origin`` header is present and not allowed (HTTP 403).
    """
    server = scope.get("server")
    local_port: int | None = None
    loopback = False
    if server is not None and server[1] is not None:
        local_port = int(server[1])
        loopback = is_loopback(str(server[0]))
    # (1) Host: always required and always checked.
    host = headers.get("host")
    hosts = allowed_hosts or (_loopback_hosts(local_port) if loopback else ())
    if not host or not _matches(host.lower(), hosts):
        raise HostForbidden(cause="host_not_allowed")
    # (2) Origin: absent passes; present must be allowed.
    origin = headers.get("origin")
    if origin is None:
        return
    origins = allowed_origins or (_loopback_origins(local_port) if loopback else ())
    if not _matches(origin.lower(), origins):
        raise OriginForbidden(cause="origin_not_allowed")


@functools.lru_cache(maxsize=64)
def _loopback_hosts(port: int | None) -> tuple[str, ...]:
    names = [f"{name}:{port}" for name in _LOOPBACK_NAMES]
    if port == 80:
        names.extend(_LOOPBACK_NAMES)  # the default port may be left out of Host
    return tuple(names)


@functools.lru_cache(maxsize=64)
def _loopback_origins(port: int | None) -> tuple[str, ...]:
    origins = [f"http://{name}:{port}" for name in _LOOPBACK_NAMES]
    if port == 80:
        origins.extend(f"http://{name}" for name in _LOOPBACK_NAMES)
    return tuple(origins)


def _matches(value: str, allowed: Iterable[str]) -> bool:
    for entry in allowed:
        entry = entry.lower()
        if value == entry:
            return True
        # "host:*" (the SDK's form): that host on any port, never the host with no port or another host.
        if entry.endswith(":*") and value.startswith(entry[:-1]) and value[len(entry) - 1 :].isdigit():
            return True
    return False
