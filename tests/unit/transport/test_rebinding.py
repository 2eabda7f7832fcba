"""DNS-rebinding checks: Host and Origin against explicit lists or the loopback default (issue 8 point 6)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.datastructures import Headers

from bastion.errors import HostForbidden, OriginForbidden
from bastion.transport.rebinding import check_host_and_origin, is_loopback


def _scope(server: tuple[str, int] | None, **headers: str) -> tuple[dict[str, Any], Headers]:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "server": server, "headers": raw}
    return scope, Headers(scope=scope)


@pytest.mark.parametrize("host", ["localhost:8123", "127.0.0.1:8123", "[::1]:8123", "LOCALHOST:8123"])
@pytest.mark.parametrize("bound", ["127.0.0.1", "::1"])
def test_loopback_default_allows_the_loopback_names_on_the_bound_port(host: str, bound: str) -> None:
    """On a loopback address, localhost, 127.0.0.1 and [::1] with that port pass, as Host and as Origin."""
    scope, headers = _scope((bound, 8123), host=host, origin=f"http://{host.lower()}")
    check_host_and_origin(scope, headers, (), ())


@pytest.mark.parametrize(
    "host", ["evil.example:8123", "localhost:9999", "localhost", "127.0.0.1.evil.example:8123", ""]
)
def test_loopback_default_refuses_other_hosts_and_ports(host: str) -> None:
    """A rebinding name, another port, a missing port or an empty Host is refused with 421."""
    scope, headers = _scope(("127.0.0.1", 8123), host=host)
    with pytest.raises(HostForbidden) as refused:
        check_host_and_origin(scope, headers, (), ())
    assert refused.value.http_status == 421


def test_missing_host_is_refused() -> None:
    """A request without a Host header is refused."""
    scope, headers = _scope(("127.0.0.1", 8123))
    with pytest.raises(HostForbidden):
        check_host_and_origin(scope, headers, (), ())


@pytest.mark.parametrize("origin", ["http://evil.example", "http://localhost:9999", "https://localhost:8123"])
def test_loopback_default_refuses_foreign_origins(origin: str) -> None:
    """A browser Origin other than the loopback ones on the bound port (http) is refused with 403."""
    scope, headers = _scope(("127.0.0.1", 8123), host="localhost:8123", origin=origin)
    with pytest.raises(OriginForbidden):
        check_host_and_origin(scope, headers, (), ())


def test_non_loopback_address_without_a_list_refuses_everything() -> None:
    """Off loopback there is no default: even the address's own name is refused until listed."""
    scope, headers = _scope(("10.0.0.5", 443), host="10.0.0.5:443")
    with pytest.raises(HostForbidden):
        check_host_and_origin(scope, headers, (), ())


def test_explicit_lists_replace_the_default() -> None:
    """Listed hosts (exact or host:*) and origins pass; the loopback names no longer do unless listed."""
    hosts = ("mcp.example.com", "gw.internal:*")
    origins = ("https://app.example.com",)
    for host in ("mcp.example.com", "gw.internal:8443"):
        scope, headers = _scope(("10.0.0.5", 443), host=host, origin="https://app.example.com")
        check_host_and_origin(scope, headers, hosts, origins)
    for host in ("localhost:443", "gw.internal", "gw.internal:x", "mcp.example.com:443"):
        scope, headers = _scope(("127.0.0.1", 443), host=host)
        with pytest.raises(HostForbidden):
            check_host_and_origin(scope, headers, hosts, origins)
    scope, headers = _scope(("10.0.0.5", 443), host="mcp.example.com", origin="http://localhost:443")
    with pytest.raises(OriginForbidden):
        check_host_and_origin(scope, headers, hosts, origins)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, expected: bool) -> None:
    """Only addresses and names that mean this machine alone are loopback."""
    assert is_loopback(host) is expected
