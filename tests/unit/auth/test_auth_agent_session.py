"""Client-certificate fingerprints for mutual TLS (DESIGN section 2 step 2): trusted sources only."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bastion.auth.agent_session import client_certificate_fingerprint, normalize_fingerprint
from bastion.errors import Unauthenticated

FINGERPRINT = hashlib.sha256(b"certificate").hexdigest()
HEADER = "x-client-cert-sha256"


def scope(
    peer: str = "10.0.0.5", headers: list[tuple[bytes, bytes]] | None = None, **extra: Any
) -> dict[str, Any]:
    return {"type": "http", "client": (peer, 50000), "headers": headers or [], **extra}


def self_signed_pem() -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agent-1")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    der = certificate.public_bytes(serialization.Encoding.DER)
    return certificate.public_bytes(serialization.Encoding.PEM).decode(), hashlib.sha256(der).hexdigest()


def test_nothing_configured_means_no_certificate() -> None:
    """By default a header that looks like a fingerprint is not read: no certificate, fail closed."""
    assert client_certificate_fingerprint(scope(headers=[(HEADER.encode(), FINGERPRINT.encode())])) is None


def test_the_tls_extension_is_read_when_the_server_fills_it() -> None:
    """A server implementing the ASGI TLS extension gives the leaf certificate: its DER SHA-256."""
    pem, expected = self_signed_pem()
    tls_scope = scope(extensions={"tls": {"client_cert_chain": [pem]}})
    assert client_certificate_fingerprint(tls_scope) == expected


def test_trusted_proxy_header_is_read_and_normalized() -> None:
    """From a trusted proxy, the configured header gives the fingerprint, colons and case normalized."""
    colon_form = ":".join(FINGERPRINT[i : i + 2] for i in range(0, 64, 2)).upper()
    request = scope(headers=[(HEADER.encode(), colon_form.encode())])
    assert (
        client_certificate_fingerprint(request, trusted_header=HEADER, trusted_proxies={"10.0.0.5"})
        == FINGERPRINT
    )
    assert (
        client_certificate_fingerprint(scope(), trusted_header=HEADER, trusted_proxies={"10.0.0.5"}) is None
    )


@pytest.mark.parametrize(
    ("peer", "values"),
    [
        ("203.0.113.9", [FINGERPRINT]),  # not a trusted proxy: a forgery
        ("10.0.0.5", [FINGERPRINT, FINGERPRINT]),  # ambiguous
        ("10.0.0.5", ["sha1:" + "a" * 40]),  # not a SHA-256 fingerprint
    ],
)
def test_untrusted_or_unusable_header_is_refused(peer: str, values: list[str]) -> None:
    """The header from an untrusted peer, twice, or malformed: Unauthenticated, never ignored."""
    request = scope(peer, headers=[(HEADER.encode(), v.encode()) for v in values])
    with pytest.raises(Unauthenticated):
        client_certificate_fingerprint(request, trusted_header=HEADER, trusted_proxies={"10.0.0.5"})


@pytest.mark.parametrize("bad", ["", "zz" * 32, FINGERPRINT[:40], FINGERPRINT + "00"])
def test_normalize_refuses_what_is_not_sha256(bad: str) -> None:
    """Only 64 hex digits (colons allowed) are a fingerprint; a SHA-1 length one is refused."""
    with pytest.raises(ValueError):
        normalize_fingerprint(bad)
