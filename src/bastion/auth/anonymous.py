"""The anonymous agent may only be served on a loopback bind (issue 8, "how the suite reaches Bastion").

Owns: the one check that a configuration naming an anonymous agent
(``[agents.NAME] anonymous = true``) is served only where no other machine can
reach it. A request without credentials is then that agent: authenticated as
nobody, but audited under its name and bound by its grants like any other.
Never relaxes anything for a request that does carry a credential.
"""

from __future__ import annotations

import ipaddress

from bastion.errors import ConfigError
from bastion.policy.snapshot import Snapshot

__all__ = ["is_loopback_host", "refuse_anonymous_off_loopback"]


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a bind address or a name) can only be reached from this machine."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_anonymous_off_loopback(snapshot: Snapshot, host: str) -> None:
    """Raise ``ConfigError`` when an anonymous agent would be served on a non-loopback bind."""
    anonymous = [agent.name for agent in snapshot.agents if agent.anonymous]
    if anonymous and not is_loopback_host(host):
        raise ConfigError(
            f"agents.{anonymous[0]}: an anonymous agent is served only on a loopback bind "
            f"(127.0.0.1, ::1, localhost), not {host!r}"
        )
