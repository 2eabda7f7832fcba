"""Shared helpers of the issue #4 end-to-end tests: agent sessions, grants, reload and OAuth.

A gateway here is the real app on a real loopback socket, built from a real
TOML file (so ``POST /admin/reload`` and SIGHUP have a file to re-read),
with the admin and auditor credentials in its ``[auth]`` table. The socket is
bound before the app is built, so a test knows the gateway's URL while it
writes the configuration (OAuth's ``resource_url`` must name it).
Requests that need exact statuses, headers or ``params._cmcp`` go out as raw
HTTP; the helpers below speak the session era (``2025-06-18``) for them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.types import ASGIApp

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import Gateway, RuntimeOptions
from bastion.policy.load import load_snapshot
from tests.e2e.conftest import TOKENS, gateway_config

ADMIN_TOKEN = "admin-token-" + "d" * 32
AUDITOR_TOKEN = "auditor-token-" + "e" * 32
SESSION_VERSION = "2025-06-18"
ACCEPT = "application/json, text/event-stream"
WAIT_S = 20.0  # the bound on any single wait in these tests


# ---------------------------------------------------------------- configuration files


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _toml_table(lines: list[str], path: list[str], table: Mapping[str, Any], *, array: bool = False) -> None:
    scalars = {k: v for k, v in table.items() if not _is_table(v) and not _is_table_array(v)}
    tables = {k: v for k, v in table.items() if _is_table(v)}
    arrays = {k: v for k, v in table.items() if _is_table_array(v)}
    if path:
        header = ".".join(json.dumps(p) for p in path)
        lines.append(f"[[{header}]]" if array else f"[{header}]")
    for key, value in scalars.items():
        lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        if array:
            # Inside an array-of-tables element, nested tables are written inline.
            lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
        else:
            _toml_table(lines, [*path, key], value)
    for key, items in arrays.items():
        for item in items:
            _toml_table(lines, [*path, key], item, array=True)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def toml_dumps(config: Mapping[str, Any]) -> str:
    """``config`` as TOML text (the subset these tests write: tables, arrays of tables, scalars)."""
    lines: list[str] = []
    _toml_table(lines, [], config)
    return "\n".join(lines) + "\n"


def auth_table(**extra: Any) -> dict[str, Any]:
    """The ``[auth]`` table: the admin credential and one auditor credential, by digest only."""
    return {
        "admin_token_sha256": hash_token(ADMIN_TOKEN),
        "auditor_token_sha256": [hash_token(AUDITOR_TOKEN)],
        **extra,
    }


def base_config(tmp_path: Path, tools_url: str, **gateway: Any) -> dict[str, Any]:
    """conftest's two upstreams and two static agents, plus the ``[auth]`` table."""
    config = gateway_config(tmp_path, tools_url, **gateway)
    config["auth"] = auth_table()
    return config


def write_config(path: Path, config: Mapping[str, Any]) -> str:
    """Write ``config`` to ``path``; returns the snapshot version it will load as."""
    path.write_text(toml_dumps(config))
    return load_snapshot(path).version


# ---------------------------------------------------------------- a gateway on a bound socket


def bound_listener() -> socket.socket:
    """A TCP socket bound to a free loopback port, not yet serving."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    return listener


def url_of(listener: socket.socket) -> str:
    return f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"


@contextlib.asynccontextmanager
async def serve_bound(app: ASGIApp, listener: socket.socket) -> AsyncIterator[str]:
    """Serve ``app`` on ``listener`` (as ``serve_on_loopback`` does on a port of its own); yields ``/mcp``."""
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [listener])
            with anyio.fail_after(30):
                while not server.started:
                    if server.should_exit:
                        raise RuntimeError("server failed to start")
                    await anyio.sleep(0.01)
            try:
                yield url_of(listener)
            finally:
                server.should_exit = True
    finally:
        listener.close()


@dataclass
class FileGateway:
    """A running gateway built from the TOML file at ``config_path``."""

    url: str
    gateway: Gateway
    config_path: Path
    data_dir: Path

    @property
    def origin(self) -> str:
        return self.url.removesuffix("/mcp")

    @property
    def db_path(self) -> Path:
        return self.data_dir / "bastion.db"


@contextlib.asynccontextmanager
async def file_gateway(
    config_path: Path, data_dir: Path, *, listener: socket.socket | None = None
) -> AsyncIterator[FileGateway]:
    """The real app, from the file, on a loopback socket, built as ``bastion serve`` builds it."""
    app = create_app(load_snapshot(config_path), RuntimeOptions(data_dir=data_dir))
    async with serve_bound(app, listener or bound_listener()) as url:
        yield FileGateway(url, app.state.gateway, config_path, data_dir)


# ---------------------------------------------------------------- the admin API


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class AgentSession:
    agent_session_id: str
    token: str
    expires_at: str


async def create_agent_session(
    http: httpx.AsyncClient,
    origin: str,
    *,
    agent: str = "carol",
    human: str = "carol@example.com",
    ttl_s: float = 600,
    **extra: Any,
) -> AgentSession:
    """``POST /admin/agent-sessions``: a new agent session and its bearer token."""
    response = await http.post(
        f"{origin}/admin/agent-sessions",
        headers=bearer(ADMIN_TOKEN),
        json={"agent": agent, "human": human, "ttl_s": ttl_s, **extra},
    )
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    return AgentSession(
        body["agent_session"]["agent_session_id"], body["token"], body["agent_session"]["expires_at"]
    )


async def revoke_agent_session(
    http: httpx.AsyncClient, origin: str, agent_session_id: str, *, reason: str = "test"
) -> dict[str, Any]:
    response = await http.post(
        f"{origin}/admin/agent-sessions/{agent_session_id}/revoke",
        headers=bearer(ADMIN_TOKEN),
        json={"by": "security@example.com", "reason": reason},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def reload_policy(http: httpx.AsyncClient, origin: str) -> httpx.Response:
    return await http.post(f"{origin}/admin/reload", headers=bearer(ADMIN_TOKEN))


async def readyz(http: httpx.AsyncClient, origin: str) -> tuple[int, dict[str, Any]]:
    response = await http.get(f"{origin}/readyz", headers=bearer(ADMIN_TOKEN))
    body: dict[str, Any] = response.json()
    return response.status_code, body


# ---------------------------------------------------------------- raw MCP over HTTP (session era)


def mcp_headers(token: str, session_id: str | None = None) -> dict[str, str]:
    headers = {**bearer(token), "accept": ACCEPT, "content-type": "application/json"}
    if session_id is not None:
        headers["mcp-session-id"] = session_id
        headers["mcp-protocol-version"] = SESSION_VERSION
    return headers


def rpc(
    method: str, params: dict[str, Any] | None = None, request_id: int | str | None = 1
) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if request_id is not None:
        message["id"] = request_id
    return message


def initialize_message() -> dict[str, Any]:
    return rpc(
        "initialize",
        {"protocolVersion": SESSION_VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    )


async def open_session(http: httpx.AsyncClient, url: str, token: str) -> str:
    """A new session-era transport session opened with ``token``; returns its ``Mcp-Session-Id``."""
    response = await http.post(url, headers=mcp_headers(token), json=initialize_message())
    assert response.status_code == 200, response.text
    session_id = response.headers["mcp-session-id"]
    ack = await http.post(
        url, headers=mcp_headers(token, session_id), json=rpc("notifications/initialized", request_id=None)
    )
    assert ack.status_code == 202, ack.text
    return session_id


def tool_call(
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    execution_id: str | None = None,
    progress_token: str | None = None,
    request_id: int | str = 1,
) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments or {}}
    if execution_id is not None:
        params["_cmcp"] = {"execution_id": execution_id}
    if progress_token is not None:
        params["_meta"] = {"progressToken": progress_token}
    return rpc("tools/call", params, request_id)


def messages_of(response: httpx.Response) -> list[dict[str, Any]]:
    """Every JSON-RPC message of an answer: one JSON body, or the ``data:`` lines of an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        lines = response.text.splitlines()  # a priming event (empty data) is no message
        return [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip()]
    if not response.content:
        return []
    return [response.json()]


def answer_of(response: httpx.Response, request_id: int | str = 1) -> dict[str, Any]:
    """The JSON-RPC response to ``request_id`` in an answer (result or error)."""
    for message in messages_of(response):
        if message.get("id") == request_id and ("result" in message or "error" in message):
            return message
    raise AssertionError(f"no response to request {request_id}: {response.status_code} {response.text}")


async def call(
    http: httpx.AsyncClient,
    url: str,
    token: str,
    session_id: str,
    name: str,
    arguments: dict[str, Any] | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """One raw ``tools/call`` on a transport session."""
    return await http.post(
        url, headers=mcp_headers(token, session_id), json=tool_call(name, arguments, **kwargs)
    )


def reason_of(answer: dict[str, Any]) -> str | None:
    return answer["error"]["data"]["reason"] if "error" in answer else None


def assert_refused(response: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    """A request refused before dispatch: ``status``, a JSON-RPC error with ``reason``, no traceback."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["error"]["data"]["reason"] == reason, body
    assert "Traceback" not in response.text
    if status == 401:
        assert response.headers["www-authenticate"].startswith("Bearer ")
    return body


# ---------------------------------------------------------------- the official SDK client


@contextlib.asynccontextmanager
async def sdk_client(url: str, token: str, *, mode: str = "legacy") -> AsyncIterator[Client]:
    """The official MCP client with any bearer token (conftest's ``client`` takes static agents only)."""
    async with (
        httpx2.AsyncClient(headers=bearer(token), timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


def static_token(agent: str) -> str:
    return TOKENS[agent]


# ---------------------------------------------------------------- evidence


async def export_entries(
    http: httpx.AsyncClient, origin: str, evidence_session_id: str, *, token: str = AUDITOR_TOKEN
) -> list[dict[str, Any]]:
    """``GET /audit/export?session_id=``: the chain's entries, in order."""
    response = await http.get(
        f"{origin}/audit/export", params={"session_id": evidence_session_id}, headers=bearer(token)
    )
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


@contextlib.contextmanager
def read_only_db(path: Path) -> Iterator[sqlite3.Connection]:
    """The store file opened read-only, to find rows no read path lists (closed on exit)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        yield conn
    finally:
        conn.close()


def entries_with_event(db_path: Path, event: str) -> list[dict[str, Any]]:
    """Every audit entry of ``event`` in the store, across all chains."""
    with read_only_db(db_path) as conn:
        rows = conn.execute("SELECT entry FROM entries ORDER BY session_id, seq").fetchall()
    entries = [json.loads(row[0]) for row in rows]
    return [e for e in entries if e.get("event") == event]
