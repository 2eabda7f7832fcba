"""Client capabilities as an upstream sees them through Bastion (DESIGN sections 1 and 5, issue 22).

Owns two small answers: which of a client's declared capabilities Bastion declares upstream
on its behalf (every one Bastion can bridge back to that client, exactly as the client declared
it, never one it did not), and the key that names a distinct set of them, so a catalog can be
kept per capability set (``upstream/fleet.py``). Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.crypto.jcs import canonical_json

__all__ = ["BRIDGED_CAPABILITIES", "bridged_capabilities", "capability_key"]

# The client-side features an upstream may use through the gateway: each has a relay path back to
# the client that declared it (upstream/relay.py, upstream/input_rounds.py). Elicitation is passed
# as declared, so its form and URL modes are declared upstream exactly when the client declared them.
BRIDGED_CAPABILITIES = ("sampling", "elicitation", "roots")


def bridged_capabilities(client_capabilities: Any) -> dict[str, Any]:
    """What Bastion declares upstream for a client that declared ``client_capabilities``."""
    if not isinstance(client_capabilities, Mapping):
        return {}
    return {k: v for k, v in client_capabilities.items() if k in BRIDGED_CAPABILITIES}


def capability_key(client_capabilities: Any) -> str:
    """The name of the capability set an upstream sees for this client: ``""`` when it sees none.

    Two clients whose bridged capabilities are equal JSON share a key; the value is canonical
    (RFC 8785), so key order and spacing never make two sets of one.
    """
    bridged = bridged_capabilities(client_capabilities)
    if not bridged:
        return ""
    try:
        return canonical_json(bridged).decode()
    except Exception:  # no canonical form (a huge integer): still one key per distinct value
        return repr(sorted(bridged.items()))
