"""Front-door rules (DESIGN section 2 step 1): every status and error, with raw HTTP."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.conftest import TOKENS, RunningGateway

pytestmark = pytest.mark.anyio

ACCEPT = "application/json, text/event-stream"
MODERN = "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def headers(agent: str = "alice", **extra: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {TOKENS[agent]}",
        "accept": ACCEPT,
        "content-type": "application/json",
        **extra,
    }


def rpc(
    method: str, params: dict[str, Any] | None = None, request_id: int | str | None = 1
) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if request_id is not None:
        message["id"] = request_id
    return message


INIT = rpc(
    "initialize",
    {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
)


async def open_session(http: httpx.AsyncClient, url: str, agent: str = "alice") -> str:
    response = await http.post(url, headers=headers(agent), json=INIT)
    assert response.status_code == 200
    session_id = response.headers["mcp-session-id"]
    assert response.json()["result"]["protocolVersion"] == "2025-06-18"
    ack = await http.post(
        url,
        headers=headers(agent, **{"mcp-session-id": session_id, "mcp-protocol-version": "2025-06-18"}),
        json=rpc("notifications/initialized", request_id=None),
    )
    assert ack.status_code == 202
    return session_id


def session_headers(session_id: str, agent: str = "alice", version: str = "2025-06-18") -> dict[str, str]:
    return headers(agent, **{"mcp-session-id": session_id, "mcp-protocol-version": version})


def assert_error(response: httpx.Response, status: int, code: int, reason: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["code"] == code
    assert body["error"]["data"]["reason"] == reason
    assert "Traceback" not in response.text
    return body


async def test_initialize_mints_a_long_random_session_id(running_gateway: RunningGateway) -> None:
    """initialize mints a fresh id of at least 128 bits, never the same twice."""
    async with running_gateway.raw() as http:
        ids = {await open_session(http, running_gateway.url) for _ in range(5)}
    assert len(ids) == 5
    for session_id in ids:
        assert len(session_id) >= 22  # 192 bits in URL-safe base64
        assert session_id.isascii() and session_id.isprintable()


async def test_missing_session_id_is_400_and_creates_nothing(running_gateway: RunningGateway) -> None:
    """A non-initialize request without Mcp-Session-Id is 400 and no session is created."""
    before = len(running_gateway.gateway.registry)
    async with running_gateway.raw() as http:
        response = await http.post(running_gateway.url, headers=headers(), json=rpc("tools/list"))
    assert_error(response, 400, -32600, "session_id_missing")
    assert len(running_gateway.gateway.registry) == before


async def test_unknown_and_foreign_session_ids_get_the_same_404(running_gateway: RunningGateway) -> None:
    """An unknown id and another agent's id are answered identically: 404, no hint of which."""
    async with running_gateway.raw() as http:
        bobs = await open_session(http, running_gateway.url, agent="bob")
        unknown = await http.post(
            running_gateway.url, headers=session_headers("x" * 32), json=rpc("tools/list")
        )
        foreign = await http.post(running_gateway.url, headers=session_headers(bobs), json=rpc("tools/list"))
        still_bobs = await http.post(
            running_gateway.url, headers=session_headers(bobs, "bob"), json=rpc("tools/list")
        )
    body_unknown = assert_error(unknown, 404, -32001, "session_not_found")
    body_foreign = assert_error(foreign, 404, -32001, "session_not_found")
    assert body_unknown == body_foreign
    assert still_bobs.status_code == 200


async def test_delete_terminates_then_404(running_gateway: RunningGateway) -> None:
    """DELETE ends the session; the id is then unknown (404)."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        deleted = await http.delete(running_gateway.url, headers=session_headers(session_id))
        after = await http.post(
            running_gateway.url, headers=session_headers(session_id), json=rpc("tools/list")
        )
        again = await http.delete(running_gateway.url, headers=session_headers(session_id))
    assert deleted.status_code == 200
    assert_error(after, 404, -32001, "session_not_found")
    assert_error(again, 404, -32001, "session_not_found")


async def test_another_supported_version_is_served_at_the_negotiated_one(
    running_gateway: RunningGateway,
) -> None:
    """Another session-era version header is served (the negotiated one governs); an unsupported one: 400."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        other = await http.post(
            running_gateway.url,
            headers=session_headers(session_id, version="2025-11-25"),
            json=rpc("tools/list"),
        )
        oldest = await http.post(
            running_gateway.url,
            headers=session_headers(session_id, version="2025-03-26"),
            json=rpc("tools/call", {"name": "tools__echo", "arguments": {"text": "old"}}, request_id=2),
        )
        unsupported = await http.post(
            running_gateway.url,
            headers=session_headers(session_id, version="1999-01-01"),
            json=rpc("tools/list"),
        )
        ok = await http.post(running_gateway.url, headers=session_headers(session_id), json=rpc("tools/list"))
    assert other.status_code == 200, other.text
    assert any(t["name"] == "tools__echo" for t in other.json()["result"]["tools"])
    assert oldest.json()["result"]["content"][0]["text"] == "old"
    assert_error(unsupported, 400, -32022, "unsupported_protocol_version")
    assert ok.status_code == 200
    # The session keeps the version initialize negotiated.
    (held,) = [s for s in running_gateway.gateway.registry if s.id == session_id]
    assert held.protocol_version == "2025-06-18"


async def test_get_stream_takes_any_supported_version_and_refuses_an_unsupported_one(
    running_gateway: RunningGateway,
) -> None:
    """GET opens the session's stream under another session-era version header; an unsupported one is 400."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        get_headers = {**session_headers(session_id, version="2025-03-26"), "accept": "text/event-stream"}
        with anyio.fail_after(10):
            async with http.stream("GET", running_gateway.url, headers=get_headers) as response:
                status = response.status_code
        refused = await http.get(
            running_gateway.url,
            headers={**session_headers(session_id, version="1999-01-01"), "accept": "text/event-stream"},
        )
    assert status == 200
    assert_error(refused, 400, -32022, "unsupported_protocol_version")


async def test_initialize_counter_offers_for_an_unknown_version(running_gateway: RunningGateway) -> None:
    """A client asking for a version we do not speak is offered the latest session-era one."""
    async with running_gateway.raw() as http:
        message = rpc("initialize", {"protocolVersion": "2099-01-01", "capabilities": {}, "clientInfo": {}})
        response = await http.post(running_gateway.url, headers=headers(), json=message)
    assert response.json()["result"]["protocolVersion"] == "2025-11-25"


async def test_bad_origin_is_403(running_gateway: RunningGateway) -> None:
    """A browser Origin that is not allowed is refused before anything else."""
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url, headers=headers(origin="http://evil.example"), json=INIT
        )
    assert_error(response, 403, -32600, "origin_forbidden")


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", "Basic dXNlcjpwYXNz", "Bearer"],
)
async def test_bad_credentials_are_401_with_www_authenticate(
    running_gateway: RunningGateway, authorization: str | None
) -> None:
    """Missing, unknown or malformed credentials: 401 with WWW-Authenticate, and no token echoed."""
    request_headers = headers()
    del request_headers["authorization"]
    if authorization is not None:
        request_headers["authorization"] = authorization
    async with running_gateway.raw() as http:
        response = await http.post(running_gateway.url, headers=request_headers, json=INIT)
    assert_error(response, 401, -32002, "credential_invalid")
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "wrong-token" not in response.text


async def test_token_in_query_string_is_refused(running_gateway: RunningGateway) -> None:
    """A credential in the URL is refused even when the header is valid."""
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url + "?access_token=" + TOKENS["alice"], headers=headers(), json=INIT
        )
    assert_error(response, 401, -32002, "credential_invalid")


async def test_malformed_json_is_parse_error(running_gateway: RunningGateway) -> None:
    """A body that is not JSON: -32700, HTTP 400, id null."""
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url, headers=headers(), content=b'{"jsonrpc": "2.0", "id": 1,'
        )
    body = assert_error(response, 400, -32700, "parse_error")
    assert body["id"] is None


@pytest.mark.parametrize(
    "payload",
    [
        [],
        [INIT],
        "just a string",
        {"jsonrpc": "1.0", "id": 1, "method": "initialize"},
        {"jsonrpc": "2.0", "id": True, "method": "initialize"},
        {"jsonrpc": "2.0", "id": None, "method": "initialize"},
        {"jsonrpc": "2.0", "id": 1, "method": 7},
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": [1, 2]},
        {"jsonrpc": "2.0", "id": 1},
    ],
)
async def test_invalid_jsonrpc_is_invalid_request(running_gateway: RunningGateway, payload: Any) -> None:
    """Well-formed JSON that is not one valid JSON-RPC message: -32600, HTTP 400."""
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url, headers=headers(), content=json.dumps(payload).encode()
        )
    assert_error(response, 400, -32600, "invalid_request")


async def test_unknown_method_is_method_not_found(running_gateway: RunningGateway) -> None:
    """An unknown method inside a valid session: -32601."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        response = await http.post(
            running_gateway.url, headers=session_headers(session_id), json=rpc("no/such")
        )
    body = assert_error(response, 200, -32601, "method_not_found")
    assert body["id"] == 1


async def test_oversized_body_is_413_and_the_service_stays_up(running_gateway: RunningGateway) -> None:
    """A body over the limit is 413, with or without Content-Length, and the next request works."""
    big = json.dumps(rpc("tools/list", {"pad": "x" * 2_000_000})).encode()

    async def chunks() -> Any:
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    async with running_gateway.raw() as http:
        declared = await http.post(running_gateway.url, headers=headers(), content=big)
        streamed = await http.post(running_gateway.url, headers=headers(), content=chunks())
        session_id = await open_session(http, running_gateway.url)
    assert_error(declared, 413, -32600, "body_too_large")
    assert_error(streamed, 413, -32600, "body_too_large")
    assert session_id


async def test_wrong_media_types(running_gateway: RunningGateway) -> None:
    """Content-Type other than JSON is 415; an Accept without JSON is 406."""
    async with running_gateway.raw() as http:
        text = await http.post(
            running_gateway.url, headers=headers(**{"content-type": "text/plain"}), content=json.dumps(INIT)
        )
        accept = await http.post(running_gateway.url, headers=headers(accept="text/html"), json=INIT)
    assert_error(text, 415, -32600, "unsupported_media_type")
    assert_error(accept, 406, -32600, "not_acceptable")


async def test_other_http_methods_are_405(running_gateway: RunningGateway) -> None:
    """PUT and PATCH are 405 with an Allow header."""
    async with running_gateway.raw() as http:
        response = await http.put(running_gateway.url, headers=headers(), json=INIT)
    assert_error(response, 405, -32600, "method_not_allowed")
    assert "POST" in response.headers["allow"]


async def test_wrong_param_types_are_invalid_params(running_gateway: RunningGateway) -> None:
    """tools/call with a non-string name or non-object arguments: -32602, the session stays usable."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url)
        bad_name = await http.post(
            running_gateway.url, headers=session_headers(session_id), json=rpc("tools/call", {"name": 5})
        )
        bad_args = await http.post(
            running_gateway.url,
            headers=session_headers(session_id),
            json=rpc("tools/call", {"name": "tools__echo", "arguments": [1]}),
        )
        ok = await http.post(
            running_gateway.url,
            headers=session_headers(session_id),
            json=rpc("tools/call", {"name": "tools__echo", "arguments": {"text": "still up"}}),
        )
    assert_error(bad_name, 200, -32602, "invalid_params")
    assert_error(bad_args, 200, -32602, "invalid_params")
    assert "still up" in ok.text


# ---------------------------------------------------------------- sessionless era


def modern_headers(method: str, name: str | None = None, version: str = MODERN) -> dict[str, str]:
    extra = {"mcp-protocol-version": version, "mcp-method": method}
    if name is not None:
        extra["mcp-name"] = name
    return headers(**extra)


async def test_sessionless_discover_and_call_leave_no_state(running_gateway: RunningGateway) -> None:
    """server/discover and tools/call work without a session and leave no transport session behind."""
    async with running_gateway.raw() as http:
        discover = await http.post(
            running_gateway.url,
            headers=modern_headers("server/discover"),
            json=rpc("server/discover", {"_meta": MODERN_META}),
        )
        call = await http.post(
            running_gateway.url,
            headers=modern_headers("tools/call", "tools__echo"),
            json=rpc("tools/call", {"name": "tools__echo", "arguments": {"text": "x"}, "_meta": MODERN_META}),
        )
    assert MODERN in discover.json()["result"]["supportedVersions"]
    assert "mcp-session-id" not in discover.headers
    assert call.json()["result"]["content"][0]["text"] == "x"
    assert len(running_gateway.gateway.registry) == 0


async def test_sessionless_header_and_meta_must_agree(running_gateway: RunningGateway) -> None:
    """Header and _meta versions that disagree: 400; a name header that disagrees: 400; no _meta: 400."""
    other_meta = {**MODERN_META, "io.modelcontextprotocol/protocolVersion": "2025-11-25"}
    async with running_gateway.raw() as http:
        version = await http.post(
            running_gateway.url,
            headers=modern_headers("tools/list"),
            json=rpc("tools/list", {"_meta": other_meta}),
        )
        name = await http.post(
            running_gateway.url,
            headers=modern_headers("tools/call", "tools__other"),
            json=rpc("tools/call", {"name": "tools__echo", "arguments": {"text": "x"}, "_meta": MODERN_META}),
        )
        no_meta = await http.post(
            running_gateway.url, headers=modern_headers("tools/list"), json=rpc("tools/list")
        )
    assert_error(version, 400, -32020, "header_mismatch")
    assert_error(name, 400, -32020, "header_mismatch")
    assert_error(no_meta, 400, -32602, "invalid_params")


async def test_sessionless_get_and_delete_are_405(running_gateway: RunningGateway) -> None:
    """The sessionless era has no GET stream and no DELETE."""
    async with running_gateway.raw() as http:
        get = await http.get(running_gateway.url, headers=modern_headers("x"))
        delete = await http.delete(running_gateway.url, headers=modern_headers("x"))
    assert get.status_code == 405
    assert delete.status_code == 405


async def test_sessionless_ignores_a_session_id(running_gateway: RunningGateway) -> None:
    """A session id on a sessionless request binds it to nothing: the request is served alone."""
    async with running_gateway.raw() as http:
        session_id = await open_session(http, running_gateway.url, agent="bob")
        response = await http.post(
            running_gateway.url,
            headers={**modern_headers("tools/list"), "mcp-session-id": session_id},
            json=rpc("tools/list", {"_meta": MODERN_META}),
        )
    assert response.status_code == 200
    assert response.json()["result"]["resultType"] == "complete"


async def test_sessionless_unknown_method_is_404(running_gateway: RunningGateway) -> None:
    """In the sessionless era an unknown method maps to HTTP 404, as the 2026 wire asks."""
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url,
            headers=modern_headers("no/such"),
            json=rpc("no/such", {"_meta": MODERN_META}),
        )
    assert_error(response, 404, -32601, "method_not_found")
