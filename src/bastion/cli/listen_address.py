"""The listen address checked before anything starts (issue #26 point 2).

A port already taken used to surface only after the upstreams had started, as
``start failed: see the log``. ``bastion serve`` now binds the address once,
as uvicorn will (``SO_REUSEADDR``), before it starts anything, and refuses in
one line naming the address when it cannot.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["listen_address_refusal"]


def listen_address_refusal(host: str, port: int) -> str | None:
    """``None`` when ``host:port`` can be bound now; else the one line that says why not."""
    if port == 0:
        return None  # the kernel picks a free port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"start refused: listen address {host}:{port} does not resolve ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                return f"start refused: listen address {shown} is already in use; choose another --port"
            return f"start refused: cannot listen on {shown}: {exc.strerror or exc}"
    return None
