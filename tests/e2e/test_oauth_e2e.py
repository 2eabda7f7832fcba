"""OAuth 2.1 through the front door (issue #4, DESIGN section 2 step 2; MCP authorization, RFC 9728).

A real gateway whose ``[auth] resource_url`` is its own URL (its socket is
bound before the file is written) and whose ``[auth.oauth]`` trusts a JWKS
served here on 127.0.0.1, with RSA keys generated here and JWTs signed here.
The ``tools`` upstream is the example tools server on a loopback socket of
its own, behind a plain ASGI recorder of every request it receives, so the
test can see what the gateway sends upstream; ``notes`` is the stdio
subprocess as elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bastion.auth.agent_session import StoreBearerAuth
from bastion.auth.authenticator import Authenticator
from bastion.auth.oauth import OAuthVerifier
from bastion.examples.counter import FileCounter
from bastion.examples.tools_server import build_app, build_server
from tests.e2e.conftest import gateway_config
from tests.e2e.issue4_support import (
    ADMIN_TOKEN,
    FileGateway,
    assert_refused,
    auth_table,
    bearer,
    bound_listener,
    file_gateway,
    initialize_message,
    mcp_headers,
    sdk_client,
    serve_bound,
    static_token,
    url_of,
    write_config,
)

pytestmark = pytest.mark.anyio

ISSUER = "https://auth.example.test"
CLIENT_ID = "claude-desktop"
AGENT = "oauth:" + CLIENT_ID


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so one OAuth gateway serves the cases that leave its JWKS cache alone."""
    return "asyncio"


# ---------------------------------------------------------------- keys, tokens and a real JWKS endpoint


@dataclass(frozen=True)
class Key:
    kid: str
    private: rsa.RSAPrivateKey

    def jwk(self) -> dict[str, Any]:
        public: dict[str, Any] = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**public, "kid": self.kid, "use": "sig", "alg": "RS256"}

    def sign(self, claims: dict[str, Any], *, kid: str | None = None) -> str:
        return jwt.encode(claims, self.private, algorithm="RS256", headers={"kid": kid or self.kid})


def new_key(kid: str) -> Key:
    return Key(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048))


class JwksServer:
    """A loopback HTTP server serving a JWK set that a test can change; counts its fetches."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {"keys": []}
        self.hits = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer._lock:
                    outer.hits += 1
                    body = json.dumps(outer.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/jwks.json"

    def serve(self, *keys: Key) -> None:
        with self._lock:
            self.document = {"keys": [k.jwk() for k in keys]}

    def __enter__(self) -> JwksServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class Keys:
    first: Key
    second: Key
    stranger: Key  # never published by the issuer


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(new_key("issuer-key-1"), new_key("issuer-key-2"), new_key("issuer-key-1"))


def claims(audience: str, **overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": audience,
        "sub": "user-123",
        "client_id": CLIENT_ID,
        "email": "alice@example.com",
        "scope": "tools:call",
        "jti": f"jti-{now}",
        "iat": now - 5,
        "exp": now + 300,
    }
    base.update(overrides)
    return base


# ---------------------------------------------------------------- an upstream that records what it receives


@dataclass
class Recorded:
    headers: list[tuple[str, str]]
    body: bytes = b""


@dataclass
class Recorder:
    """Plain ASGI around the example tools server: every HTTP request's headers and body, kept."""

    app: ASGIApp
    requests: list[Recorded] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = Recorded([(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]])
        self.requests.append(record)

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                record.body += message.get("body", b"")
            return message

        await self.app(scope, recording_receive, send)


@contextlib.asynccontextmanager
async def recorded_tools_upstream(counter: Path) -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder(build_app(build_server(FileCounter(counter)), host="127.0.0.1", json_response=False))
    async with serve_bound(recorder, bound_listener()) as url:
        yield url, recorder


# ---------------------------------------------------------------- the gateway


@dataclass
class OAuthGateway:
    gw: FileGateway
    jwks: JwksServer
    keys: Keys
    recorder: Recorder

    @property
    def url(self) -> str:
        return self.gw.url

    @property
    def metadata_url(self) -> str:
        return self.gw.origin + "/.well-known/oauth-protected-resource/mcp"

    def token(self, key: Key | None = None, **overrides: Any) -> str:
        return (key or self.keys.first).sign(claims(self.url, **overrides))


def oauth_config(directory: Path, url: str, tools_url: str, jwks_url: str) -> dict[str, Any]:
    config = gateway_config(directory, tools_url)
    config["auth"] = auth_table(
        resource_url=url,
        oauth={"issuer": ISSUER, "jwks_url": jwks_url, "agent_prefix": "oauth:"},
    )
    config["grants"] = [
        {"name": "oauth-client", "agent": AGENT, "servers": ["tools", "notes"], "tools": ["echo"]},
        {"name": "alice-all", "agent": "alice", "servers": ["tools", "notes"], "tools": ["*"]},
    ]
    return config


@contextlib.asynccontextmanager
async def oauth_gateway(directory: Path, keys: Keys) -> AsyncIterator[OAuthGateway]:
    with JwksServer() as jwks:
        jwks.serve(keys.first)
        async with recorded_tools_upstream(directory / "counter.log") as (tools_url, recorder):
            listener = bound_listener()
            path = directory / "bastion.toml"
            write_config(path, oauth_config(directory, url_of(listener), tools_url, jwks.url))
            async with file_gateway(path, directory / "data", listener=listener) as gw:
                yield OAuthGateway(gw, jwks, keys, recorder)


@pytest.fixture(scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory, keys: Keys) -> AsyncIterator[OAuthGateway]:
    async with oauth_gateway(tmp_path_factory.mktemp("oauth"), keys) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def assert_challenge(response: httpx.Response, og: OAuthGateway) -> None:
    """401 ``credential_invalid`` with ``WWW-Authenticate: Bearer resource_metadata="…"`` (RFC 9728)."""
    assert_refused(response, 401, "credential_invalid")
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith(f'Bearer resource_metadata="{og.metadata_url}"'), challenge
    assert 'error="invalid_token"' in challenge


# ---------------------------------------------------------------- the cases


async def test_a_valid_jwt_works_end_to_end_and_never_reaches_the_upstream(
    shared: OAuthGateway, http: httpx.AsyncClient
) -> None:
    """The SDK client with a valid JWT lists its granted tools and calls; the upstream never sees it."""
    token = shared.token()
    before = len(shared.recorder.requests)
    async with sdk_client(shared.url, token) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("tools__echo", {"text": "via oauth"})
        notes = await client.call_tool("notes__echo", {"text": "notes via oauth"})
    assert names == {"tools__echo", "notes__echo"}  # the grant for "oauth:claude-desktop"
    assert result.is_error is False and result.content[0].text == "via oauth"  # type: ignore[union-attr]
    assert notes.content[0].text == "notes via oauth"  # type: ignore[union-attr]

    # What the gateway sent the HTTP upstream on this client's behalf: no Authorization, no token anywhere.
    sent = shared.recorder.requests[before:]
    assert any(b"via oauth" in r.body for r in sent)
    for request in sent:
        assert "authorization" not in {name for name, _ in request.headers}
        assert not any(token in value for _, value in request.headers)
        assert token.encode() not in request.body
        assert token.split(".")[2].encode() not in request.body  # not even the signature


def _wrong_audience(og: OAuthGateway) -> str:
    return og.token(aud="https://other.example.test/mcp")


def _wrong_issuer(og: OAuthGateway) -> str:
    return og.token(iss="https://evil.example.test")


def _expired(og: OAuthGateway) -> str:
    now = int(time.time())
    return og.token(iat=now - 3600, exp=now - 600)  # past the 30 s leeway


def _bad_signature(og: OAuthGateway) -> str:
    return og.token(key=og.keys.stranger)  # the published kid, another private key


def _unknown_kid(og: OAuthGateway) -> str:
    return og.keys.second.sign(claims(og.url))  # a key the JWKS does not serve


REFUSALS: list[Any] = [
    pytest.param(_wrong_audience, id="wrong-audience"),
    pytest.param(_wrong_issuer, id="wrong-issuer"),
    pytest.param(_expired, id="expired"),
    pytest.param(_bad_signature, id="bad-signature"),
    pytest.param(_unknown_kid, id="unknown-kid"),
]


@pytest.mark.parametrize("make_token", REFUSALS)
async def test_each_bad_token_is_refused_with_the_challenge(
    shared: OAuthGateway, http: httpx.AsyncClient, make_token: Any
) -> None:
    """Wrong audience, wrong issuer, expired, bad signature, unknown kid: 401 with the RFC 9728 challenge."""
    token = make_token(shared)
    response = await http.post(shared.url, headers=mcp_headers(token), json=initialize_message())
    assert_challenge(response, shared)
    assert token not in response.text


async def test_a_token_in_the_query_string_is_refused(shared: OAuthGateway, http: httpx.AsyncClient) -> None:
    """A valid token in the URL is refused (401 with the challenge), alone or next to a valid header."""
    token = shared.token()
    headers = mcp_headers(token)
    del headers["authorization"]
    alone = await http.post(
        shared.url, params={"access_token": token}, headers=headers, json=initialize_message()
    )
    assert_challenge(alone, shared)
    both = await http.post(
        shared.url, params={"access_token": token}, headers=mcp_headers(token), json=initialize_message()
    )
    assert_challenge(both, shared)
    # The same token in the header alone is fine: the refusals above are about where it travelled.
    fine = await http.post(shared.url, headers=mcp_headers(token), json=initialize_message())
    assert fine.status_code == 200, fine.text


async def test_protected_resource_metadata(shared: OAuthGateway, http: httpx.AsyncClient) -> None:
    """RFC 9728: the document the challenge names describes this resource and its issuer."""
    refused = await http.post(shared.url, headers=mcp_headers("not-a-token"), json=initialize_message())
    assert refused.status_code == 401
    named = refused.headers["www-authenticate"].split('resource_metadata="')[1].split('"')[0]
    assert named == shared.metadata_url
    for url in (named, shared.gw.origin + "/.well-known/oauth-protected-resource"):
        response = await http.get(url)
        assert response.status_code == 200, url
        document = response.json()
        assert document["resource"] == shared.url
        assert document["authorization_servers"] == [ISSUER]
        assert document["bearer_methods_supported"] == ["header"]


async def test_static_agents_still_work_next_to_oauth(shared: OAuthGateway) -> None:
    """A configured static agent is not shadowed by the OAuth resource server."""
    async with sdk_client(shared.url, static_token("alice")) as client:
        result = await client.call_tool("tools__echo", {"text": "static"})
    assert result.content[0].text == "static"  # type: ignore[union-attr]


# ---------------------------------------------------------------- key rotation


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def own(tmp_path: Path, keys: Keys) -> AsyncIterator[OAuthGateway]:
    async with oauth_gateway(tmp_path, keys) as running:
        yield running


async def test_unknown_kid_then_key_rotation(own: OAuthGateway, http: httpx.AsyncClient) -> None:
    """A token whose kid the JWKS lacks is refused; once the issuer rotates to that key, it is accepted.

    The JWKS cache refreshes at most once per 30 s and that interval is not
    configurable in the file, so this test swaps the gateway's authenticator
    for one built the same way (public constructors, the same OAuth settings
    and store) but whose JWKS clock it can step. Everything else is the real
    gateway and a real JWKS over HTTP.
    """
    gateway = own.gw.gateway
    settings = gateway.snapshot().auth.oauth
    assert settings is not None and gateway.store is not None
    clock = Clock()
    async with httpx.AsyncClient(trust_env=False) as jwks_http:
        gateway.authenticator = Authenticator(
            gateway.auth, StoreBearerAuth(gateway.store), OAuthVerifier(settings, jwks_http, monotonic=clock)
        )
        own.jwks.serve(own.keys.first)
        hits = own.jwks.hits

        accepted = await http.post(own.url, headers=mcp_headers(own.token()), json=initialize_message())
        assert accepted.status_code == 200, accepted.text
        assert own.jwks.hits == hits + 1

        # The issuer signs with a key it has not published: one refresh, still unknown, refused.
        rotated_token = own.token(key=own.keys.second)
        clock.now += 31
        unknown = await http.post(own.url, headers=mcp_headers(rotated_token), json=initialize_message())
        assert_challenge(unknown, own)
        assert own.jwks.hits == hits + 2
        # A flood of unknown kids inside the interval fetches nothing more.
        for _ in range(5):
            again = await http.post(own.url, headers=mcp_headers(rotated_token), json=initialize_message())
            assert again.status_code == 401
        assert own.jwks.hits == hits + 2

        # Rotation: the JWKS now serves the new key only; the next permitted refresh finds it.
        own.jwks.serve(own.keys.second)
        clock.now += 31
        async with sdk_client(own.url, rotated_token) as client:
            result = await client.call_tool("tools__echo", {"text": "rotated"})
        assert result.content[0].text == "rotated"  # type: ignore[union-attr]
        assert own.jwks.hits == hits + 3
        # The retired key went with that refresh.
        retired = await http.post(own.url, headers=mcp_headers(own.token()), json=initialize_message())
        assert_challenge(retired, own)


async def test_a_reload_that_changes_the_issuer_is_applied_or_refused(
    own: OAuthGateway, http: httpx.AsyncClient
) -> None:
    """After a reload names a new issuer, its tokens decide, not the old one's (or the reload is refused)."""
    config = oauth_config(own.gw.config_path.parent, own.url, _tools_url(own), own.jwks.url)
    config["auth"]["oauth"]["issuer"] = "https://auth-2.example.test"
    write_config(own.gw.config_path, config)
    reloaded = await http.post(f"{own.gw.origin}/admin/reload", headers=bearer(ADMIN_TOKEN))
    if reloaded.status_code == 422:
        return  # refusing the change (restart to apply), as for servers, is a consistent answer
    assert reloaded.status_code == 200, reloaded.text
    metadata = (await http.get(own.metadata_url)).json()
    assert metadata["authorization_servers"] == ["https://auth-2.example.test"]
    old_issuer = await http.post(own.url, headers=mcp_headers(own.token()), json=initialize_message())
    assert old_issuer.status_code == 401, "a token of the issuer the snapshot no longer trusts was accepted"
    new_issuer = own.token(iss="https://auth-2.example.test")
    accepted = await http.post(own.url, headers=mcp_headers(new_issuer), json=initialize_message())
    assert accepted.status_code == 200, accepted.text


def _tools_url(og: OAuthGateway) -> str:
    return str(og.gw.gateway.snapshot().servers["tools"].url)
