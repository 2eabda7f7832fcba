"""Tests for auth/oauth.py against a real local JWKS endpoint and real signed tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from bastion.auth.oauth import (
    ClaimRules,
    OAuthSettings,
    OAuthVerifier,
    protected_resource_metadata,
    refuse_query_token,
    resource_metadata_url,
    www_authenticate,
)
from bastion.auth.principal import Principal
from bastion.errors import ConfigError, Unauthenticated
from bastion.ids import AgentId

ISSUER = "https://auth.example.com"
RESOURCE = "https://gateway.example.com/mcp"
T0 = 1_700_000_000.0


# ---------------------------------------------------------------- a real JWKS endpoint


class JwksServer:
    """A loopback HTTP server that serves a JWK set it can change, and counts requests."""

    def __init__(self) -> None:
        self.document: Any = {"keys": []}
        self.status = 200
        self.hits = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer._lock:
                    outer.hits += 1
                    status, document = outer.status, outer.document
                body = document if isinstance(document, bytes) else json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/jwks.json"

    def serve(self, *jwks: Any) -> None:
        with self._lock:
            self.document = {"keys": list(jwks)}

    def __enter__(self) -> JwksServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    with JwksServer() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False) as client:
        yield client


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- keys and tokens made here


class Key:
    def __init__(self, kid: str, private: Any, alg: str) -> None:
        self.kid, self.private, self.alg = kid, private, alg

    def jwk(self, **extra: Any) -> dict[str, Any]:
        algorithm = RSAAlgorithm if self.alg.startswith(("RS", "PS")) else ECAlgorithm
        jwk: dict[str, Any] = algorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "use": "sig", **extra}

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"kid": self.kid, **header})


@pytest.fixture(scope="module")
def rsa_key() -> Key:
    return Key("rsa-1", rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")


@pytest.fixture(scope="module")
def rsa_key_2() -> Key:
    return Key("rsa-2", rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")


@pytest.fixture(scope="module")
def ec_key() -> Key:
    return Key("ec-1", ec.generate_private_key(ec.SECP256R1()), "ES256")


def claims(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": RESOURCE,
        "sub": "user-123",
        "client_id": "claude-desktop",
        "email": "alice@example.com",
        "team": "ops",
        "scope": "notes:read notes:write",
        "jti": "token-7",
        "iat": int(T0) - 10,
        "nbf": int(T0) - 10,
        "exp": int(T0) + 300,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


class Harness:
    def __init__(self, verifier: OAuthVerifier, clock: Clock, monotonic: Clock) -> None:
        self.verifier, self.clock, self.monotonic = verifier, clock, monotonic

    async def verify(self, token: str) -> Principal:
        with anyio.fail_after(10):
            return await self.verifier.authenticate(f"Bearer {token}")

    async def refused(self, token: str, cause: str) -> Unauthenticated:
        with pytest.raises(Unauthenticated) as excinfo:
            await self.verify(token)
        exc = excinfo.value
        assert exc.cause == cause
        assert exc.reason.value == "credential_invalid" and exc.http_status == 401
        # The token never appears in what the error carries.
        assert token not in str(exc) and token not in repr(exc.data) and token not in (exc.cause or "")
        return exc


def harness(http: httpx.AsyncClient, jwks_url: str, **settings: Any) -> Harness:
    settings.setdefault("claims", ClaimRules(team_claim="team"))
    config = OAuthSettings(issuer=ISSUER, audience=RESOURCE, jwks_url=jwks_url, **settings)
    clock, monotonic = Clock(T0), Clock(1000.0)
    return Harness(OAuthVerifier(config, http, clock=clock, monotonic=monotonic), clock, monotonic)


# ---------------------------------------------------------------- accepted tokens


@pytest.mark.anyio
async def test_valid_rsa_token_maps_to_principal(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """A token signed by the issuer's RSA key, for this resource, in time, names its principal."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    principal = await h.verify(rsa_key.sign(claims()))
    assert principal == Principal(
        agent=AgentId("claude-desktop"),
        agent_session_id=None,
        human="alice@example.com",
        team="ops",
        scopes=frozenset({"notes:read", "notes:write"}),
        credential_id="token-7",
        expires_at=datetime.fromtimestamp(T0 + 300, tz=UTC),
    )


@pytest.mark.anyio
async def test_valid_ec_token_with_scp_array_and_audience_list(
    jwks_server: JwksServer, http: httpx.AsyncClient, ec_key: Key
) -> None:
    """An ES256 token whose aud is a list holding this resource, with scopes as an scp array, is accepted."""
    jwks_server.serve(ec_key.jwk())
    h = harness(
        http,
        jwks_server.url,
        algorithms=("ES256",),
        claims=ClaimRules(agent_claims=("sub",), agent_prefix="oauth:", human_claims=()),
    )
    token = ec_key.sign(claims(aud=["https://other.example.com", RESOURCE], scope=None, scp=["a", "b"]))
    principal = await h.verify(token)
    assert principal.agent == "oauth:user-123"
    assert principal.human is None and principal.team is None
    assert principal.scopes == frozenset({"a", "b"})


@pytest.mark.anyio
async def test_leeway_accepts_small_clock_skew(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """Within the configured leeway, a just-expired or not-quite-valid token still passes."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url, leeway_s=30)
    await h.verify(rsa_key.sign(claims(exp=int(T0) - 29)))
    await h.verify(rsa_key.sign(claims(nbf=int(T0) + 29, iat=int(T0) + 29)))


# ---------------------------------------------------------------- refused tokens, named for their defect


@pytest.mark.anyio
async def test_wrong_audience_refused(jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key) -> None:
    """A token minted for another resource is refused (RFC 8707: no token passthrough)."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    await h.refused(rsa_key.sign(claims(aud="https://other.example.com/mcp")), "wrong_audience")
    await h.refused(rsa_key.sign(claims(aud=None)), "missing_claim")


@pytest.mark.anyio
async def test_wrong_issuer_refused(jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key) -> None:
    """A token from another issuer is refused even when signed by a key in the JWKS."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    await h.refused(rsa_key.sign(claims(iss="https://evil.example.com")), "wrong_issuer")


@pytest.mark.anyio
async def test_expired_refused(jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key) -> None:
    """A token past exp plus leeway is refused; one without exp is refused too."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url, leeway_s=30)
    exc = await h.refused(rsa_key.sign(claims(exp=int(T0) - 30)), "expired")
    assert "expired" in exc.message
    await h.refused(rsa_key.sign(claims(exp=None)), "missing_claim")
    # The same token is accepted earlier and refused once the injected clock passes exp.
    token = rsa_key.sign(claims(exp=int(T0) + 60))
    await h.verify(token)
    h.clock.now = T0 + 90
    await h.refused(token, "expired")


@pytest.mark.anyio
async def test_not_yet_valid_refused(jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key) -> None:
    """A token whose nbf (or iat) lies beyond the leeway in the future is refused."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url, leeway_s=30)
    await h.refused(rsa_key.sign(claims(nbf=int(T0) + 31)), "not_yet_valid")
    await h.refused(rsa_key.sign(claims(iat=int(T0) + 31, nbf=None)), "issued_in_future")


@pytest.mark.anyio
async def test_bad_signature_refused(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key, rsa_key_2: Key
) -> None:
    """A token signed by another key under a trusted kid, or altered after signing, is refused."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    impostor = Key(rsa_key.kid, rsa_key_2.private, "RS256")
    await h.refused(impostor.sign(claims()), "bad_signature")
    header, _payload, signature = rsa_key.sign(claims()).split(".")
    forged = base64.urlsafe_b64encode(json.dumps(claims(client_id="admin")).encode()).rstrip(b"=").decode()
    await h.refused(f"{header}.{forged}.{signature}", "bad_signature")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.anyio
async def test_alg_none_refused(jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key) -> None:
    """An unsigned token (alg none) is refused before any key is looked up."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    token = jwt.encode(claims(), "", algorithm="none", headers={"kid": rsa_key.kid})
    await h.refused(token, "algorithm_not_allowed")
    assert jwks_server.hits == 0


@pytest.mark.anyio
async def test_hs256_signed_with_public_key_refused(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """The classic key-confusion forgery (HS256 keyed with the RSA public key) is refused."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    public_pem = rsa_key.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    signing_input = (
        _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": rsa_key.kid}).encode())
        + "."
        + _b64(json.dumps(claims()).encode())
    )
    mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    await h.refused(f"{signing_input}.{_b64(mac)}", "algorithm_not_allowed")


@pytest.mark.anyio
async def test_algorithm_must_match_the_key(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key, ec_key: Key
) -> None:
    """An allowed algorithm with a kid whose key is of another type finds no key."""
    jwks_server.serve(rsa_key.jwk(), ec_key.jwk())
    h = harness(http, jwks_server.url, algorithms=("RS256", "ES256"))
    lying = Key(rsa_key.kid, ec_key.private, "ES256")  # header says ES256 and the RSA key's kid
    await h.refused(lying.sign(claims()), "unknown_kid")


@pytest.mark.anyio
async def test_malformed_tokens_refused(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """Garbage, a token without kid, and an oversized token are refused without a JWKS fetch."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    await h.refused("not-a-jwt", "malformed")
    await h.refused(jwt.encode(claims(), rsa_key.private, algorithm="RS256"), "no_kid")
    await h.refused("a" * 20_000, "too_large")
    assert jwks_server.hits == 0


@pytest.mark.anyio
async def test_claims_that_cannot_map_are_refused(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """No agent claim, or a mapped claim of the wrong type, refuses the token."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url, claims=ClaimRules(agent_claims=("client_id",), team_claim="team"))
    await h.refused(rsa_key.sign(claims(client_id=None)), "no_agent_claim")
    await h.refused(rsa_key.sign(claims(team=["ops", "dev"])), "bad_claim_team")
    await h.refused(rsa_key.sign(claims(scope=42)), "bad_claim_scope")
    await h.refused(rsa_key.sign(claims(client_id="bad\nname")), "bad_claim_client_id")


# ---------------------------------------------------------------- the JWKS cache


@pytest.mark.anyio
async def test_unknown_kid_then_key_rotation(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key, rsa_key_2: Key
) -> None:
    """A new kid is refused while the JWKS lacks it; after rotation one refresh finds it."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url, jwks_min_refresh_interval_s=30)
    await h.verify(rsa_key.sign(claims()))
    assert jwks_server.hits == 1

    # The issuer signs with a key it has not published yet: one refresh, still unknown.
    h.monotonic.now += 31
    await h.refused(rsa_key_2.sign(claims()), "unknown_kid")
    assert jwks_server.hits == 2

    # Rotation: the JWKS now serves the new key only; once a refresh is permitted, it is found.
    jwks_server.serve(rsa_key_2.jwk())
    h.monotonic.now += 31
    await h.verify(rsa_key_2.sign(claims()))
    assert jwks_server.hits == 3
    # The retired key is gone with the refresh.
    await h.refused(rsa_key.sign(claims()), "unknown_kid")
    assert jwks_server.hits == 3


@pytest.mark.anyio
async def test_refresh_rate_limit_holds(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """A flood of tokens with forged kids causes at most one fetch per refresh interval."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url, jwks_min_refresh_interval_s=30)
    await h.verify(rsa_key.sign(claims()))
    for n in range(50):
        forged = Key(f"forged-{n}", rsa_key.private, "RS256")
        await h.refused(forged.sign(claims()), "unknown_kid")
        h.monotonic.now += 0.5  # 25 s in all: still inside one interval
    assert jwks_server.hits == 1  # the first fetch only: it started the interval
    # Valid tokens keep working from the cache meanwhile.
    await h.verify(rsa_key.sign(claims()))
    h.monotonic.now += 5  # 30 s since the first fetch: one refresh is permitted, then none
    for n in range(10):
        await h.refused(Key(f"forged-x{n}", rsa_key.private, "RS256").sign(claims()), "unknown_kid")
    assert jwks_server.hits == 2
    assert h.verifier.jwks.fetches == 2


@pytest.mark.anyio
async def test_concurrent_lookups_share_one_fetch(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """Twenty concurrent first requests cause one JWKS fetch."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    token = rsa_key.sign(claims())
    results: list[Principal] = []

    async def one() -> None:
        results.append(await h.verify(token))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one)
    assert len(results) == 20
    assert jwks_server.hits == 1


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/jwks.json"


@pytest.mark.anyio
async def test_jwks_unreachable_refuses(http: httpx.AsyncClient, rsa_key: Key) -> None:
    """With no JWKS to be had, every token is refused (fail closed), and retries are paced."""
    h = harness(http, _closed_port_url())
    await h.refused(rsa_key.sign(claims()), "jwks_unavailable")
    await h.refused(rsa_key.sign(claims()), "jwks_unavailable")
    assert h.verifier.jwks.fetches == 1


@pytest.mark.parametrize(
    ("status", "document"),
    [(500, {"keys": []}), (200, b"not json"), (200, {"nokeys": []}), (302, {"keys": []})],
)
@pytest.mark.anyio
async def test_jwks_broken_answer_refuses(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key, status: int, document: Any
) -> None:
    """An error status, a redirect, or a body that is not a JWK set yields no keys: refused."""
    jwks_server.status, jwks_server.document = status, document
    h = harness(http, jwks_server.url)
    await h.refused(rsa_key.sign(claims()), "jwks_unavailable")


@pytest.mark.anyio
async def test_stale_keys_are_not_used_when_jwks_goes_down(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """Cached keys serve until max age; past it, with the JWKS down, tokens are refused."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url, jwks_max_age_s=600, jwks_min_refresh_interval_s=30)
    token = rsa_key.sign(claims())
    await h.verify(token)
    jwks_server.status = 503
    h.monotonic.now += 599
    await h.verify(token)  # still fresh: no fetch needed
    assert jwks_server.hits == 1
    h.monotonic.now += 2
    await h.refused(token, "jwks_unavailable")
    assert jwks_server.hits == 2
    # The JWKS comes back: after the refresh interval, tokens pass again.
    jwks_server.status = 200
    h.monotonic.now += 30
    await h.verify(token)


@pytest.mark.anyio
async def test_unusable_jwks_entries_are_ignored(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key, ec_key: Key
) -> None:
    """Symmetric keys, keys with private parts, encryption keys and keys pinned to another alg are skipped."""
    private_jwk = RSAAlgorithm.to_jwk(rsa_key.private, as_dict=True)
    jwks_server.serve(
        {"kty": "oct", "kid": "hmac", "k": _b64(b"secret")},
        {**private_jwk, "kid": "private"},
        rsa_key.jwk(kid="enc", use="enc"),
        rsa_key.jwk(kid="pinned", alg="RS512"),
        {"kty": "RSA", "kid": "junk", "n": "!!", "e": "AQAB"},
        "not-an-object",
        ec_key.jwk(),
    )
    h = harness(http, jwks_server.url, algorithms=("RS256", "ES256"))
    await h.verify(ec_key.sign(claims()))
    for kid in ("private", "enc", "pinned", "junk"):
        await h.refused(Key(kid, rsa_key.private, "RS256").sign(claims()), "unknown_kid")


# ---------------------------------------------------------------- the wire


@pytest.mark.parametrize(
    "query",
    [
        b"access_token=abc",
        b"x=1&access_token=abc",
        b"ACCESS_TOKEN=abc",
        b"access%5Ftoken=abc",
        b"token=abc",
        b"bearer=",
        "authorization=Bearer+abc",
    ],
)
def test_token_in_query_string_refused(query: bytes | str) -> None:
    """A credential-like query parameter is refused, whatever its case or encoding."""
    with pytest.raises(Unauthenticated) as excinfo:
        refuse_query_token(query)
    assert excinfo.value.cause == "token_in_query"
    assert "abc" not in excinfo.value.message


@pytest.mark.parametrize("query", [b"", b"x=1", b"tokens_left=3", "cursor=abc"])
def test_other_query_strings_pass(query: bytes | str) -> None:
    """Query strings without credentials are left alone."""
    refuse_query_token(query)


@pytest.mark.anyio
async def test_authenticate_refuses_query_token_even_with_valid_header(
    jwks_server: JwksServer, http: httpx.AsyncClient, rsa_key: Key
) -> None:
    """A request that also carries its token in the URL is refused: URLs end up in logs."""
    jwks_server.serve(rsa_key.jwk())
    h = harness(http, jwks_server.url)
    token = rsa_key.sign(claims())
    with pytest.raises(Unauthenticated) as excinfo:
        await h.verifier.authenticate(f"Bearer {token}", f"access_token={token}".encode())
    assert excinfo.value.cause == "token_in_query"


@pytest.mark.anyio
async def test_authenticate_needs_a_bearer_header(http: httpx.AsyncClient) -> None:
    """No header, another scheme, or an empty token: refused."""
    h = harness(http, _closed_port_url())
    for header, cause in (
        (None, "no_credential"),
        ("Basic dXNlcjpwdw==", "not_bearer"),
        ("Bearer ", "not_bearer"),
    ):
        with pytest.raises(Unauthenticated) as excinfo:
            await h.verifier.authenticate(header)
        assert excinfo.value.cause == cause


def test_www_authenticate_values() -> None:
    """The challenge names the resource metadata, then error and description as RFC 6750 spells them."""
    url = "https://gateway.example.com/.well-known/oauth-protected-resource/mcp"
    assert www_authenticate(url) == f'Bearer resource_metadata="{url}"'
    assert www_authenticate(url, "invalid_token", "The access token expired") == (
        f'Bearer resource_metadata="{url}", error="invalid_token", '
        'error_description="The access token expired"'
    )
    assert www_authenticate(url, "insufficient_scope", scope="notes:write").endswith('scope="notes:write"')
    with pytest.raises(ValueError):
        www_authenticate(url, "invalid_token", 'say "hi"')
    with pytest.raises(ValueError):
        www_authenticate(url, "bad_error_code")


def test_protected_resource_metadata_document() -> None:
    """The RFC 9728 document names resource, authorization servers, scopes, and header-only bearer use."""
    document = protected_resource_metadata(RESOURCE, [ISSUER], ["notes:read", "notes:write"])
    assert document == {
        "resource": RESOURCE,
        "authorization_servers": [ISSUER],
        "scopes_supported": ["notes:read", "notes:write"],
        "bearer_methods_supported": ["header"],
    }
    with pytest.raises(ValueError):
        protected_resource_metadata(RESOURCE, [], [])


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        (RESOURCE, "https://gateway.example.com/.well-known/oauth-protected-resource/mcp"),
        ("https://gateway.example.com", "https://gateway.example.com/.well-known/oauth-protected-resource"),
        ("https://gw.example.com:8443/", "https://gw.example.com:8443/.well-known/oauth-protected-resource"),
    ],
)
def test_resource_metadata_url(resource: str, expected: str) -> None:
    """The well-known path goes between host and path (RFC 9728 section 3.1)."""
    assert resource_metadata_url(resource) == expected


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"algorithms": ("none",)}, "'none' is not allowed"),
        ({"algorithms": ("RS256", "HS256")}, "'HS256' is not allowed"),
        ({"algorithms": ()}, "must not be empty"),
        ({"jwks_url": "http://auth.example.com/jwks.json"}, "must be https"),
        ({"jwks_url": "not a url"}, "no host"),
        ({"leeway_s": 3600}, "leeway_s"),
        ({"jwks_min_refresh_interval_s": 0}, "jwks_min_refresh_interval_s"),
        ({"jwks_max_age_s": 10, "jwks_min_refresh_interval_s": 30}, "jwks_max_age_s"),
        ({"audience": ""}, "audience"),
    ],
)
def test_settings_refuse_unsafe_values(overrides: dict[str, Any], message: str) -> None:
    """No 'none', no HS*, no plain-http JWKS off loopback, bounded leeway and refresh pacing."""
    kwargs: dict[str, Any] = {
        "issuer": ISSUER,
        "audience": RESOURCE,
        "jwks_url": "https://auth.example.com/jwks.json",
        **overrides,
    }
    with pytest.raises(ConfigError, match=message):
        OAuthSettings(**kwargs)


def test_claim_rules_need_an_agent_claim() -> None:
    """Rules that could map a token to no agent are refused when built."""
    with pytest.raises(ConfigError):
        ClaimRules(agent_claims=())
    with pytest.raises(ConfigError):
        ClaimRules(team_claim="")
