"""Client capabilities as an upstream sees them through Bastion (DESIGN sections 1 and 5, issue 22).

Owns the small answers about them: which server-to-client request needs which client
capability (one table for every relay path: a call's stream, the GET stream, a stdio process),
which of a client's declared capabilities Bastion declares upstream on its behalf (every one
Bastion can bridge back to that client, exactly as the client declared it, never one it did not),
and the key that names a distinct set of them, so a catalog can be kept per capability set
(``upstream/fleet.py``). Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from bastion.crypto.jcs import canonical_json

__all__ = [
    "BRIDGED_CAPABILITIES",
    "CAPABILITY_FOR_REQUEST",
    "EVERY_BRIDGED_CAPABILITY",
    "bridged_capabilities",
    "capability_key",
    "capability_set",
    "required_capability",
]

# Each server-to-client request Bastion relays, and the client capability it needs: a client that
# did not declare it is never asked (transport/relay.py, session/server_channel.py,
# upstream/stdio_process.py, upstream/input_rounds.py all read this one table).
CAPABILITY_FOR_REQUEST: Mapping[str, str] = MappingProxyType(
    {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
)
# The client-side features an upstream may use through the gateway: each has a relay path back to
# the client that declared it (upstream/relay.py, upstream/input_rounds.py). Elicitation is passed
# as declared, so its form and URL modes are declared upstream exactly when the client declared them.
BRIDGED_CAPABILITIES = tuple(dict.fromkeys(CAPABILITY_FOR_REQUEST.values()))
# All of them, as declared upstream by a session that speaks for no one client (a shared stdio
# process, the catalog's listing process): URL-mode elicitation included (issue 22 point 2). Each
# request relayed from it is still checked against the one client it would reach.
EVERY_BRIDGED_CAPABILITY: Mapping[str, Any] = MappingProxyType(
    {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": True}}
)


def required_capability(method: str) -> str | None:
    """The client capability a server-to-client ``method`` needs; ``None``: not one Bastion relays."""
    return CAPABILITY_FOR_REQUEST.get(method)


# The parts of each that name a set (2025-11-25 schema): anything else a client adds is declared on
# its own upstream session but names no new set, so the number of sets stays small and no client
# can make Bastion list an upstream's tools again per request by varying what it declares.
_SET_PARTS = {"sampling": ("context", "tools"), "elicitation": ("form", "url"), "roots": ("listChanged",)}


def bridged_capabilities(client_capabilities: Any) -> dict[str, Any]:
    """What Bastion declares upstream for a client that declared ``client_capabilities``."""
    if not isinstance(client_capabilities, Mapping):
        return {}
    return {k: v for k, v in client_capabilities.items() if k in BRIDGED_CAPABILITIES}


def capability_set(client_capabilities: Any) -> dict[str, Any]:
    """The capability set this client belongs to: its bridged capabilities with only the parts that
    the schema defines (an object part as ``{}``, a boolean as given)."""
    shown: dict[str, Any] = {}
    for name, declared in bridged_capabilities(client_capabilities).items():
        parts = declared if isinstance(declared, Mapping) else {}
        shown[name] = {
            part: (parts[part] if isinstance(parts[part], bool) else {})
            for part in _SET_PARTS[name]
            if part in parts
        }
    return shown


def capability_key(client_capabilities: Any) -> str:
    """The name of the capability set an upstream sees for this client: ``""`` when it sees none.

    Two clients of one :func:`capability_set` share a key; the value is canonical (RFC 8785), so
    key order and spacing never make two sets of one.
    """
    shown = capability_set(client_capabilities)
    return canonical_json(shown).decode() if shown else ""
