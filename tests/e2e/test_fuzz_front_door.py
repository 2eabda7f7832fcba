"""Fuzzing the front door (issue #12): whatever arrives, no 500, no traceback, the process stays up.

A real gateway on a loopback socket, in a thread of its own (Hypothesis drives
plain synchronous requests), in front of the example HTTP tools upstream and
the garbage upstream (``garbage_upstream.py``), whose results are NaN,
surrogates and deep nesting. Hypothesis sends JSON-RPC shapes of every kind:
ids of every type, methods and tool names with lone surrogates, NaN and
Infinity anywhere, nesting from flat to thousands of levels, ``_meta`` and
``_cmcp`` of every type, random bytes, headers of random sizes and values, and
random HTTP methods; a separate case cuts bodies and headers short on a raw
socket. Invariants, for every request: the status is below 500 (503 only with
a typed reason), no answer carries traceback text, a JSON answer parses, and
``/healthz`` still answers.

Bounded for CI: ``BASTION_FUZZ_EXAMPLES`` examples (default 150). A long run
sets it higher and ``BASTION_FUZZ_REPORT=<file>`` to get the counts.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.types import ASGIApp

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS, Upstream
from tests.e2e.garbage_upstream import GARBAGE, GarbageUpstream
from tests.support.loopback import loopback_config

EXAMPLES = int(os.environ.get("BASTION_FUZZ_EXAMPLES", "150"))
REPORT = os.environ.get("BASTION_FUZZ_REPORT")
START_S = 30.0
READ_S = 8.0
RSS_BOUND_KIB = 2 * 1024 * 1024  # the whole test process, gateway and upstreams included

SESSION_VERSION = "2025-06-18"
MODERN = "2026-07-28"


# ---------------------------------------------------------------- servers in threads


@dataclass
class Threaded:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def serve_in_thread(app: ASGIApp) -> Threaded:
    """``app`` on 127.0.0.1 in a thread with its own event loop; returns once it accepts connections."""
    server = uvicorn.Server(loopback_config(app))
    thread = threading.Thread(target=server.run, name="fuzz-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return Threaded(f"http://127.0.0.1:{port}/mcp", server, thread)


@dataclass
class Target:
    url: str
    session_id: str
    seen: Counter[str] = field(default_factory=Counter)

    @property
    def origin(self) -> str:
        return self.url.removesuffix("/mcp")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tools_upstream: Upstream) -> Iterator[Target]:
    directory = tmp_path_factory.mktemp("fuzz")
    junk = serve_in_thread(GarbageUpstream().app)
    config = {
        "gateway": {"upstream_timeout_s": 5.0, "max_body_bytes": 262_144},
        "servers": {"tools": {"url": tools_upstream.url}, "junk": {"url": junk.url, "era": "sessionless"}},
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    snapshot = snapshot_from_mapping(config, source=None, version="fuzz")
    gateway = serve_in_thread(create_app(snapshot, RuntimeOptions(data_dir=directory / "data")))
    try:
        with httpx.Client(timeout=30) as http:
            opened = http.post(
                gateway.url,
                headers=_headers(),
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": SESSION_VERSION,
                        "capabilities": {},
                        "clientInfo": {"name": "fuzz", "version": "1"},
                    },
                },
            )
            assert opened.status_code == 200, opened.text
        found = Target(gateway.url, opened.headers["mcp-session-id"])
        yield found
        if REPORT:
            Path(REPORT).write_text(json.dumps(dict(found.seen), indent=1, sort_keys=True))
    finally:
        gateway.stop()
        junk.stop()


def _headers(**extra: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {TOKENS['alice']}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        **extra,
    }


# ---------------------------------------------------------------- strategies

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc00b", "\ud83d"])
PLAIN = st.text(max_size=40)
TEXT = st.one_of(PLAIN, PLAIN, PLAIN, SURROGATES)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=20,
)
IDS = st.one_of(JSON, st.integers(), st.text(max_size=10))
TOOLS = st.one_of(
    st.sampled_from(["tools__echo", "tools__count", "tools__nope", *(f"junk__{n}" for n in GARBAGE)]),
    TEXT,
)
METHODS = st.one_of(
    st.sampled_from(
        [
            "tools/call",
            "tools/list",
            "ping",
            "server/discover",
            "logging/setLevel",
            "initialize",
            "notifications/cancelled",
            "notifications/initialized",
            "resources/list",
            "prompts/get",
        ]
    ),
    TEXT,
)


@st.composite
def nested(draw: st.DrawFn) -> Any:
    depth = draw(st.sampled_from([0, 1, 50, 99, 101, 200, 324, 900, 5000]))
    value: Any = draw(SCALARS)
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@st.composite
def tool_params(draw: st.DrawFn) -> Any:
    params: dict[str, Any] = {"name": draw(TOOLS)}
    if draw(st.booleans()):
        params["arguments"] = draw(st.one_of(JSON, nested(), st.just({"text": "hi"})))
    if draw(st.booleans()):
        params["_meta"] = draw(st.one_of(JSON, st.just({"progressToken": draw(IDS)})))
    if draw(st.booleans()):
        params["_cmcp"] = draw(
            st.one_of(JSON, st.fixed_dictionaries({"execution_id": st.text(min_size=1, max_size=20)}))
        )
    return params


@st.composite
def messages(draw: st.DrawFn) -> Any:
    message: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        message["jsonrpc"] = "2.0"
    else:
        message["jsonrpc"] = draw(JSON)
    if draw(st.integers(0, 4)):
        message["id"] = draw(IDS)
    method = draw(METHODS)
    if draw(st.integers(0, 9)):
        message["method"] = method
    if method == "tools/call" and draw(st.integers(0, 5)):
        message["params"] = draw(tool_params())
    elif draw(st.booleans()):
        message["params"] = draw(st.one_of(JSON, nested()))
    if not draw(st.integers(0, 19)):
        return draw(st.lists(st.just(message), max_size=3))  # a batch
    return message


@st.composite
def well_formed(draw: st.DrawFn) -> Any:
    """A JSON-RPC request a real client could send, with fuzzed tool params."""
    method = draw(st.sampled_from(["tools/call", "tools/call", "tools/call", "tools/list", "ping"]))
    params = draw(tool_params()) if method == "tools/call" else {}
    if draw(st.booleans()):
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    return {"jsonrpc": "2.0", "id": draw(st.integers(0, 10**6)), "method": method, "params": params}


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=200))
    value = draw(well_formed()) if kind >= 5 else draw(messages())
    try:
        text = json.dumps(value, allow_nan=True)
    except (RecursionError, ValueError):
        return b"{"
    if kind == 1:
        return text.encode()[: draw(st.integers(0, max(0, len(text) - 1)))]  # cut short
    return text.encode()


@st.composite
def header_sets(draw: st.DrawFn) -> dict[str, str]:
    era = draw(st.sampled_from(["session", "session", "modern", "modern", "none", "random"]))
    headers = _headers()
    if era == "session":
        headers["mcp-protocol-version"] = SESSION_VERSION
        headers["mcp-session-id"] = draw(st.sampled_from(["SESSION", "SESSION", "SESSION", "x" * 32, ""]))
    elif era == "modern":
        headers["mcp-protocol-version"] = MODERN
        headers["mcp-method"] = draw(st.sampled_from(["tools/call", "tools/list", "x"]))
    elif era == "random":
        headers["mcp-protocol-version"] = draw(st.text(alphabet="0123456789-abc", max_size=12))
    if not draw(st.integers(0, 5)):
        headers["accept"] = draw(st.sampled_from(["", "*/*", "text/html", "application/json"]))
    if not draw(st.integers(0, 7)):
        headers["content-type"] = draw(st.sampled_from(["", "text/plain", "application/json; charset=x"]))
    if not draw(st.integers(0, 7)):
        headers["authorization"] = draw(st.sampled_from(["", "Bearer", "Bearer nope", "Basic eA=="]))
    if not draw(st.integers(0, 9)):
        headers["x-fuzz"] = "a" * draw(st.sampled_from([1, 1000, 8000, 70_000]))
    if not draw(st.integers(0, 11)):
        headers["origin"] = draw(st.sampled_from(["http://evil.example", "null", ""]))
    return headers


@st.composite
def fuzzed_case(draw: st.DrawFn) -> tuple[str, dict[str, str], bytes]:
    """Anything: method, headers and body drawn apart."""
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "DELETE", "PUT", "OPTIONS"]))
    return method, draw(header_sets()), draw(bodies())


@st.composite
def client_case(draw: st.DrawFn) -> tuple[str, dict[str, str], bytes]:
    """What a real client sends, either era, with fuzzed tool params: it reaches dispatch."""
    message = draw(well_formed())
    if draw(st.booleans()):
        message["params"].pop("_meta", None)
        headers = _headers(**{"mcp-protocol-version": SESSION_VERSION, "mcp-session-id": "SESSION"})
    else:
        message["params"]["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        headers = _headers(**{"mcp-protocol-version": MODERN, "mcp-method": message["method"]})
        name = message["params"].get("name")
        if isinstance(name, str) and name.isascii() and name.isprintable() and name.strip() == name:
            headers["mcp-name"] = name
    try:
        body = json.dumps(message, allow_nan=True).encode()
    except (RecursionError, ValueError):
        body = b"{"
    return "POST", headers, body


# ---------------------------------------------------------------- invariants


def check_answer(target: Target, response: httpx.Response) -> None:
    body = response.content
    assert response.status_code < 500 or response.status_code == 503, (response.status_code, body[:300])
    assert b"Traceback" not in body and b'File "' not in body, body[:300]
    reason = "-"
    if response.headers.get("content-type", "").startswith("application/json") and body:
        answer = json.loads(body)
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, dict):
            data = error.get("data")
            reason = data.get("reason", "-") if isinstance(data, dict) else str(error.get("reason", "-"))
    if response.status_code == 503:
        assert reason != "-", body[:300]  # a typed refusal, not an crash page
    target.seen[f"{response.status_code} {reason}"] += 1


def check_alive(target: Target, http: httpx.Client) -> None:
    assert http.get(f"{target.origin}/healthz").status_code == 200
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < RSS_BOUND_KIB


@pytest.mark.timeout(60 + EXAMPLES * (READ_S + 1))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(case=st.one_of(client_case(), client_case(), fuzzed_case()))
def test_fuzzed_requests_never_crash_the_front_door(
    target: Target, case: tuple[str, dict[str, str], bytes]
) -> None:
    """Any method, headers and body: a status below 500 (or a typed 503), no traceback, /healthz still up."""
    method, headers, body = case
    if headers.get("mcp-session-id") == "SESSION":
        headers["mcp-session-id"] = target.session_id
    # Every POST is answered within the upstream timeout (5 s); a GET may open the session's
    # event stream, which sends nothing but keep-alives: reading it times out, by design.
    with httpx.Client(timeout=httpx.Timeout(10.0, read=READ_S)) as http:
        try:
            response = http.request(method, target.url, headers=headers, content=body)
        except httpx.RemoteProtocolError:
            target.seen["connection closed"] += 1  # the server refused the request line or headers
        except httpx.ReadTimeout:
            assert method == "GET", "a POST, DELETE or other request got no answer"
            target.seen["event stream held open"] += 1
        else:
            check_answer(target, response)
        check_alive(target, http)


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /mcp HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        b'POST /mcp HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"js',
        b"POST /mcp HTTP/1.1\r\nHost: x\r\ncontent-length: -1\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 200_000 + b"\r\n\r\n",
    ],
    ids=["partial-headers", "partial-body", "negative-length", "not-http", "huge-header"],
)
def test_cut_and_broken_requests_leave_the_gateway_up(target: Target, raw: bytes) -> None:
    """A request cut short or not HTTP at all: the connection ends, the gateway keeps serving."""
    host, port = target.origin.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        try:
            conn.sendall(raw)
            conn.shutdown(socket.SHUT_WR)
            answer = conn.recv(65536)
        except OSError:
            answer = b""
    assert not answer.startswith(b"HTTP/1.1 500"), answer[:200]
    assert b"Traceback" not in answer
    with httpx.Client(timeout=30) as http:
        check_alive(target, http)
