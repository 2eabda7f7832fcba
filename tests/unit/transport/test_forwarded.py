"""Unit tests of transport/forwarded.py: forwarded client addresses are believed only from trusted proxies."""

from __future__ import annotations

from typing import Any

from bastion.transport.forwarded import client_address


def _scope(peer: str, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"client": (peer, 5555), "headers": list(headers)}


def test_a_forwarded_address_from_an_untrusted_peer_is_ignored() -> None:
    """Anyone can send X-Forwarded-For: from a peer that is not a trusted proxy, the peer is the client."""
    scope = _scope("203.0.113.9", (b"x-forwarded-for", b"10.0.0.1"))
    assert client_address(scope, ()) == "203.0.113.9"
    assert client_address(scope, ("127.0.0.1",)) == "203.0.113.9"


def test_a_trusted_proxy_names_the_client_nearest_it() -> None:
    """From a trusted proxy, the hop nearest the gateway that is not itself trusted is the client."""
    scope = _scope("127.0.0.1", (b"x-forwarded-for", b"198.51.100.7, 10.0.0.2, 127.0.0.2"))
    assert client_address(scope, ("127.0.0.1", "127.0.0.2")) == "10.0.0.2"


def test_the_forwarded_header_is_read_too() -> None:
    """RFC 7239 ``Forwarded: for=`` (quoted, IPv6 in brackets) is read like X-Forwarded-For."""
    scope = _scope("127.0.0.1", (b"forwarded", b'for="[2001:db8::1]:4711";proto=https'))
    assert client_address(scope, ("127.0.0.1",)) == "2001:db8::1"
    assert client_address(_scope("127.0.0.1"), ("127.0.0.1",)) == "127.0.0.1"
