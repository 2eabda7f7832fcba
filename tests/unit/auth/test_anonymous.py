"""The anonymous agent's configuration rules (policy/load.py, auth/anonymous.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.auth.anonymous import is_loopback_host, refuse_anonymous_off_loopback
from bastion.errors import ConfigError
from bastion.policy.load import snapshot_from_mapping

_SERVERS = {"tools": {"url": "http://127.0.0.1:9/mcp"}}
_HASH = "a" * 64


def _load(**tables: Any) -> Any:
    return snapshot_from_mapping({"servers": _SERVERS, **tables}, source=None, version="t")


def test_an_anonymous_agent_loads_without_a_token() -> None:
    """``anonymous = true`` names an agent that has no token."""
    snapshot = _load(agents={"suite": {"anonymous": True}})
    assert [(a.name, a.anonymous, a.token_sha256) for a in snapshot.agents] == [("suite", True, None)]


@pytest.mark.parametrize(
    ("agents", "defect"),
    [
        ({"suite": {"anonymous": True, "token_sha256": _HASH}}, "no token"),
        ({"a": {"anonymous": True}, "b": {"anonymous": True}}, "at most one agent may be anonymous"),
        ({"suite": {"anonymous": "yes"}}, "true or false"),
        ({"suite": {"anonymous": False}}, "token_sha256"),
    ],
)
def test_malformed_anonymous_agents_are_refused(agents: dict[str, Any], defect: str) -> None:
    """A token on an anonymous agent, two anonymous agents, or a non-boolean flag is refused at load."""
    with pytest.raises(ConfigError, match=defect):
        _load(agents=agents)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts_may_serve_an_anonymous_agent(host: str) -> None:
    """Every loopback bind passes the check."""
    assert is_loopback_host(host)
    refuse_anonymous_off_loopback(_load(agents={"suite": {"anonymous": True}}), host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.4", "gateway.example.com"])
def test_other_binds_refuse_an_anonymous_agent(host: str) -> None:
    """A wildcard, LAN address or name is refused with an anonymous agent, allowed without one."""
    with pytest.raises(ConfigError, match="loopback"):
        refuse_anonymous_off_loopback(_load(agents={"suite": {"anonymous": True}}), host)
    refuse_anonymous_off_loopback(_load(agents={"alice": {"token_sha256": _HASH}}), host)


def test_only_one_server_may_be_transparent() -> None:
    """Two transparent servers would expose unprefixed names side by side: refused at load."""
    servers = {
        "a": {"url": "http://127.0.0.1:9/mcp", "transparent": True},
        "b": {"url": "http://127.0.0.1:8/mcp", "transparent": True},
    }
    with pytest.raises(ConfigError, match="only one server may be transparent"):
        snapshot_from_mapping({"servers": servers}, source=None, version="t")
