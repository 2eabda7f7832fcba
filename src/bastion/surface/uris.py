"""The reversible, collision-free map between upstream resource URIs and the URIs clients see (issue 9).

A resource of a server with namespace ``ns`` is shown as ``bastion://ns/<original URI>``:
the original is appended verbatim (no escaping), so reading it back is a split at the
first ``/`` after the prefix. Namespaces are unique and never contain ``/`` (the
snapshot's namespace rule), so two different ``(namespace, uri)`` pairs never meet.
The transparent server's URIs are shown verbatim; one of its URIs that would read as
a mapped one (it starts with ``bastion://``) is left out, never shadowed.

URI templates map the same way, and because the prefix holds no template variable,
expanding a mapped template gives the mapped expansion: a client's completed URI
routes back to the right server. Pure functions: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GATEWAY_URI_PREFIX", "UriTarget", "expose_uri", "resolve_uri"]

GATEWAY_URI_PREFIX = "bastion://"


@dataclass(frozen=True)
class UriTarget:
    """Where an exposed URI routes: a namespace (``None`` for the transparent server) and the upstream URI."""

    namespace: str | None
    uri: str


def expose_uri(namespace: str, uri: str, *, transparent: bool) -> str | None:
    """The URI (or URI template) clients see; ``None`` when it cannot be shown without ambiguity."""
    if transparent:
        return None if uri.startswith(GATEWAY_URI_PREFIX) else uri
    return f"{GATEWAY_URI_PREFIX}{namespace}/{uri}"


def resolve_uri(exposed: str) -> UriTarget | None:
    """The inverse of :func:`expose_uri`; ``None`` for a gateway URI without a namespace."""
    if not exposed.startswith(GATEWAY_URI_PREFIX):
        return UriTarget(None, exposed)
    namespace, slash, uri = exposed[len(GATEWAY_URI_PREFIX) :].partition("/")
    if not slash or not namespace:
        return None
    return UriTarget(namespace, uri)
