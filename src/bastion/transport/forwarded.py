"""The client address of a request: the peer, or what a trusted proxy says it forwarded (issue #22).

``X-Forwarded-For`` and ``Forwarded`` are believed only when the immediate peer is one of
the configured proxies (the one list, ``auth.mtls_trusted_proxies``, that also vouches for a
client certificate header); from anyone else they are ignored, since anyone can send them.
Of a forwarded chain the address nearest the gateway that is not itself a trusted proxy is
the client. Used to name the client in log lines; never for a decision about a credential.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import Scope

__all__ = ["client_address"]


def client_address(scope: Scope, trusted_proxies: Iterable[str]) -> str:
    """The address of the client behind this request (``"?"`` when the server gave none)."""
    client = scope.get("client")
    peer = str(client[0]) if client else "?"
    trusted = set(trusted_proxies)
    if peer not in trusted:
        return peer
    hops: list[str] = []
    for name, value in scope.get("headers") or ():
        if name == b"x-forwarded-for":
            hops += [hop.strip() for hop in value.decode("latin-1").split(",")]
        elif name == b"forwarded":
            for element in value.decode("latin-1").split(","):
                for pair in element.split(";"):
                    key, _, given = pair.strip().partition("=")
                    if key.lower() == "for":
                        hops.append(given.strip().strip('"').removeprefix("[").split("]")[0])
    for hop in reversed(hops):
        if hop and hop not in trusted:
            return hop
    return peer
