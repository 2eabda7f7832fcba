"""CORS for browser clients of an allowed Origin on a real loopback socket (issue 12 point 14)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import RunningGateway, Upstream, gateway_config
from tests.e2e.test_transport_rules import INIT, assert_error, headers
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

APP_ORIGIN = "https://app.example.com"


def _loopback_origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _preflight_headers(origin: str, requested: str) -> dict[str, str]:
    return {
        "origin": origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": requested,
    }


def _cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")}


@pytest.fixture
async def app_origin_gateway(tmp_path: Path, tools_upstream: Upstream) -> AsyncIterator[str]:
    config = gateway_config(tmp_path, tools_upstream.url, allowed_origins=[APP_ORIGIN])
    app = create_app(
        snapshot_from_mapping(config, source=None, version="test"), RuntimeOptions(tmp_path / "d")
    )
    async with serve_on_loopback(app) as url:
        yield url


async def test_an_allowed_origin_gets_a_preflight_answer(running_gateway: RunningGateway) -> None:
    """A preflight from an allowed Origin is 204 naming that origin, MCP's methods and headers, and Vary."""
    origin = _loopback_origin(running_gateway.url)
    requested = "authorization, content-type, mcp-protocol-version, Mcp-Param-Region, x-evil header"
    async with running_gateway.raw() as http:
        response = await http.options(running_gateway.url, headers=_preflight_headers(origin, requested))
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert response.headers["access-control-allow-origin"] == origin
    assert response.headers["access-control-allow-methods"] == "GET, POST, DELETE"
    allowed = {name.strip() for name in response.headers["access-control-allow-headers"].split(",")}
    assert allowed == {
        "authorization",
        "content-type",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
        "mcp-method",
        "mcp-name",
        "mcp-param-region",
    }
    assert response.headers["access-control-expose-headers"] == "Mcp-Session-Id"
    assert int(response.headers["access-control-max-age"]) > 0
    assert response.headers["vary"] == "Origin"
    assert len(running_gateway.gateway.registry) == 0


async def test_a_foreign_origin_preflight_is_403_without_cors_headers(
    running_gateway: RunningGateway,
) -> None:
    """A preflight from an Origin not allowed is refused 403 and carries no CORS header."""
    port = urlsplit(running_gateway.url).port
    async with running_gateway.raw() as http:
        response = await http.options(
            running_gateway.url,
            headers=_preflight_headers(f"http://attacker.example:{port}", "authorization"),
        )
    assert_error(response, 403, -32600, "origin_forbidden")
    assert _cors_headers(response) == {}


async def test_options_without_an_origin_is_still_405(running_gateway: RunningGateway) -> None:
    """OPTIONS that is no CORS preflight (no Origin) stays 405 with an Allow header."""
    async with running_gateway.raw() as http:
        response = await http.options(running_gateway.url)
    assert_error(response, 405, -32600, "method_not_allowed")
    assert response.headers["allow"] == "GET, POST, DELETE"


async def test_answers_to_an_allowed_origin_name_it_and_expose_the_session_id(
    running_gateway: RunningGateway,
) -> None:
    """An allowed Origin's answers, errors included, name it and expose Mcp-Session-Id; no Origin, no CORS."""
    origin = _loopback_origin(running_gateway.url)
    async with running_gateway.raw() as http:
        opened = await http.post(running_gateway.url, headers=headers(origin=origin), json=INIT)
        refused = await http.post(
            running_gateway.url, headers={**headers(origin=origin), "authorization": "Bearer nope"}, json=INIT
        )
        plain = await http.post(running_gateway.url, headers=headers(), json=INIT)
    assert opened.status_code == 200, opened.text
    assert opened.headers["mcp-session-id"]
    assert opened.headers["access-control-allow-origin"] == origin
    assert opened.headers["access-control-expose-headers"] == "Mcp-Session-Id"
    assert opened.headers["vary"] == "Origin"
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == origin
    assert plain.status_code == 200
    assert _cors_headers(plain) == {}


async def test_an_explicit_origin_list_replaces_the_loopback_default(app_origin_gateway: str) -> None:
    """With allowed_origins set, its origin gets a preflight answer and the loopback origin is refused."""
    async with httpx.AsyncClient(timeout=30) as http:
        listed = await http.options(
            app_origin_gateway, headers=_preflight_headers(APP_ORIGIN, "content-type")
        )
        loopback = await http.options(
            app_origin_gateway,
            headers=_preflight_headers(_loopback_origin(app_origin_gateway), "content-type"),
        )
        answer = await http.post(app_origin_gateway, headers=headers(origin=APP_ORIGIN), json=INIT)
    assert listed.status_code == 204, listed.text
    assert listed.headers["access-control-allow-origin"] == APP_ORIGIN
    assert_error(loopback, 403, -32600, "origin_forbidden")
    assert _cors_headers(loopback) == {}
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == APP_ORIGIN
