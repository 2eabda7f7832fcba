"""The load generator: a lean MCP client over raw httpx, and the timed phases that drive it.

Lean on purpose (DESIGN section 10 compares ratios, so the client must not be
the bottleneck): one ``httpx.AsyncClient`` and one kept-alive connection per
client session, hand-built JSON-RPC bodies, and a response parser that reads
either ``application/json`` or ``text/event-stream``.

It speaks both eras as the spec and the SDK's server check them
(``mcp/shared/inbound.py``, ``classify_inbound_request``):

- session era: ``initialize``, then ``notifications/initialized``, then every
  call with ``Mcp-Session-Id`` and ``MCP-Protocol-Version`` (the negotiated
  version); ``DELETE`` at the end;
- sessionless era (2026-07-28): every POST carries ``MCP-Protocol-Version``,
  ``Mcp-Method`` and, for ``tools/call``, ``Mcp-Name``; ``params._meta``
  carries the same protocol version and the client capabilities (and client
  info). A session opens with ``server/discover``, as the SDK client does.

Every answer is checked: a refusal, an ``isError`` result or a wrong echo
counts as an error, so a fast refusal can never pass for a fast call.

A target built with ``execution_ids=True`` (Bastion only: an upstream would not
understand the envelope) gets ``params._cmcp = {"execution_id": ...}`` on every
``tools/call``, warm-up and measured alike, each id fresh and unique within
the process (a random per-process prefix and a counter), so Bastion admits
every call instead of refusing one as a replay.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import math
import secrets
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

if importlib.util.find_spec("sniffio") is None:
    # httpcore retries `import sniffio` twice per request when it is absent, and a failed
    # import walks all of sys.path each time. A None entry makes that import fail at once,
    # and httpcore then assumes asyncio, which this is.
    sys.modules["sniffio"] = None  # type: ignore[assignment]

__all__ = [
    "MODERN_VERSION",
    "SESSION_VERSION",
    "CallError",
    "McpSession",
    "PhaseResult",
    "Target",
    "lean_client",
    "next_execution_id",
    "run_phase",
]

Mode = Literal["legacy", "modern"]

SESSION_VERSION = "2025-11-25"
MODERN_VERSION = "2026-07-28"
_ACCEPT = "application/json, text/event-stream"
_CLIENT_INFO = {"name": "bastion-bench", "version": "0.1.0"}
_META_VERSION = "io.modelcontextprotocol/protocolVersion"
_META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
_META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
_CMCP = "_cmcp"
# Execution ids: unique within this process (counter) and across runs (random prefix).
# "bench-" + 16 hex + "-" + a decimal counter stays far below Bastion's 128 visible ASCII.
_EXECUTION_PREFIX = f"bench-{secrets.token_hex(8)}-"
_execution_serial = itertools.count(1)


def next_execution_id() -> str:
    """A fresh execution id, never handed out before by this process."""
    return f"{_EXECUTION_PREFIX}{next(_execution_serial)}"


class CallError(Exception):
    """An answer that is not the expected successful result."""


@dataclass(frozen=True)
class Target:
    """Where to send calls: the MCP endpoint, the echo tool's name there, extra headers.

    ``execution_ids``: every ``tools/call`` carries a fresh ``params._cmcp.execution_id``.
    Set it for Bastion only; an upstream called directly does not know the envelope.
    """

    label: str
    url: str
    tool: str
    headers: Mapping[str, str] = field(default_factory=dict)
    execution_ids: bool = False


def _parse_answer(response: httpx.Response, request_id: int) -> dict[str, Any]:
    """The JSON-RPC response for ``request_id`` from a JSON or an SSE body. Raises ``CallError``."""
    content_type = response.headers.get("content-type", "")
    if content_type.startswith("application/json"):
        message = json.loads(response.content)
        if isinstance(message, dict) and message.get("id") == request_id:
            return message
        raise CallError(f"HTTP {response.status_code}: unexpected JSON body {response.text[:300]!r}")
    if content_type.startswith("text/event-stream"):
        data: list[str] = []
        for line in [*response.text.splitlines(), ""]:
            if line.startswith("data:") and line[5:].strip():  # a priming event has empty data
                data.append(line[5:].removeprefix(" "))
            elif not line and data:
                message = json.loads("\n".join(data))
                data = []
                # Notifications (progress, logs) may precede the answer on the same stream.
                if isinstance(message, dict) and message.get("id") == request_id:
                    return message
        raise CallError(f"HTTP {response.status_code}: SSE stream ended without response {request_id}")
    raise CallError(f"HTTP {response.status_code} {content_type!r}: {response.text[:300]!r}")


def _result_of(message: Mapping[str, Any]) -> dict[str, Any]:
    if "error" in message:
        raise CallError(f"JSON-RPC error: {json.dumps(message['error'])[:300]}")
    result = message.get("result")
    if not isinstance(result, dict):
        raise CallError(f"no result in {json.dumps(message)[:300]}")
    return result


def lean_client(timeout_s: float) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` holding one kept-alive connection with ``TCP_NODELAY``."""
    return httpx.AsyncClient(
        # httpx writes a request's headers and body separately: without TCP_NODELAY, Nagle
        # holds the body until the server's delayed ACK, some 40 ms per call.
        transport=httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        ),
        timeout=httpx.Timeout(timeout_s),
        trust_env=False,  # never route loopback through a proxy from the environment
    )


class McpSession:
    """One client session against one target, in one era, on one kept-alive connection."""

    def __init__(
        self, target: Target, mode: Mode, *, timeout_s: float, client: httpx.AsyncClient | None = None
    ) -> None:
        """``client``: share one connection among many sessions (the caller closes it), else own one."""
        self.target = target
        self.mode = mode
        self._owns_client = client is None
        self._client = client if client is not None else lean_client(timeout_s)
        self._next_id = 0
        self._session_id: str | None = None
        self._version = SESSION_VERSION if mode == "legacy" else MODERN_VERSION
        self._base_headers = {
            "accept": _ACCEPT,
            "content-type": "application/json",
            **{k.lower(): v for k, v in target.headers.items()},
        }

    def _headers(self, method: str | None, name: str | None) -> dict[str, str]:
        headers = dict(self._base_headers)
        if self.mode == "modern":
            headers["mcp-protocol-version"] = self._version
            if method is not None:
                headers["mcp-method"] = method
            if name is not None:
                headers["mcp-name"] = name
        else:
            if self._session_id is not None:
                headers["mcp-session-id"] = self._session_id
                headers["mcp-protocol-version"] = self._version
        return headers

    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.mode == "modern":
            params = dict(params)
            params["_meta"] = {
                _META_VERSION: self._version,
                _META_CAPABILITIES: {},
                _META_CLIENT_INFO: _CLIENT_INFO,
            }
        return params

    async def _request(self, method: str, params: dict[str, Any], name: str | None = None) -> httpx.Response:
        self._next_id += 1
        body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": self._params(params)}
        return await self._client.post(
            self.target.url, content=json.dumps(body).encode(), headers=self._headers(method, name)
        )

    async def open(self) -> None:
        """Handshake (session era) or discover (sessionless era).

        Raises ``CallError`` or ``httpx.HTTPError``.
        """
        if self.mode == "modern":
            response = await self._request("server/discover", {})
            result = _result_of(_parse_answer(response, self._next_id))
            if MODERN_VERSION not in result.get("supportedVersions", []):
                raise CallError(
                    f"{self.target.label}: server/discover does not offer {MODERN_VERSION}: {result}"
                )
            return
        response = await self._request(
            "initialize",
            {"protocolVersion": SESSION_VERSION, "capabilities": {}, "clientInfo": _CLIENT_INFO},
        )
        result = _result_of(_parse_answer(response, self._next_id))
        session_id = response.headers.get("mcp-session-id")
        if not session_id:
            raise CallError(f"{self.target.label}: initialize answered without Mcp-Session-Id")
        self._session_id = session_id
        self._version = str(result["protocolVersion"])
        notified = await self._client.post(
            self.target.url,
            content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
            headers=self._headers(None, None),
        )
        if notified.status_code != 202:
            raise CallError(f"{self.target.label}: notifications/initialized answered {notified.status_code}")

    async def call_echo(self, text: str) -> None:
        """One ``tools/call`` of the echo tool, checked. Raises ``CallError``, ``httpx.HTTPError``."""
        params: dict[str, Any] = {"name": self.target.tool, "arguments": {"text": text}}
        if self.target.execution_ids:
            params[_CMCP] = {"execution_id": next_execution_id()}
        response = await self._request("tools/call", params, name=self.target.tool)
        result = _result_of(_parse_answer(response, self._next_id))
        if result.get("isError"):
            raise CallError(f"isError result: {json.dumps(result)[:300]}")
        content = result.get("content") or [{}]
        if content[0].get("text") != text:
            raise CallError(f"echo mismatch: {json.dumps(result)[:300]}")

    async def close(self) -> None:
        """End the session (DELETE in the session era) and the connection; never raises."""
        try:
            if self._session_id is not None:
                await self._client.delete(self.target.url, headers=self._headers(None, None))
        except httpx.HTTPError:
            pass
        finally:
            if self._owns_client:
                await self._client.aclose()


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list; NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class PhaseResult:
    """One measured phase against one target."""

    label: str
    sessions: int
    calls: int
    errors: int
    wall_s: float
    latencies_s: list[float] = field(repr=False)
    first_error: str | None = None

    @property
    def calls_per_s(self) -> float:
        return (self.calls - self.errors) / self.wall_s if self.wall_s > 0 else math.nan

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_s)
        return {
            "label": self.label,
            "sessions": self.sessions,
            "calls": self.calls,
            "errors": self.errors,
            "first_error": self.first_error,
            "wall_s": round(self.wall_s, 4),
            "calls_per_s": round(self.calls_per_s, 1),
            "p50_ms": round(percentile(ordered, 0.50) * 1e3, 3),
            "p90_ms": round(percentile(ordered, 0.90) * 1e3, 3),
            "p99_ms": round(percentile(ordered, 0.99) * 1e3, 3),
            "max_ms": round(ordered[-1] * 1e3, 3) if ordered else math.nan,
        }


async def run_phase(
    target: Target,
    mode: Mode,
    *,
    sessions: int,
    warmup_calls: int,
    calls: int,
    timeout_s: float,
    on_measure_start: Callable[[], None] | None = None,
) -> PhaseResult:
    """Open ``sessions`` sessions, warm each up, then time ``calls`` calls spread evenly across them.

    All sessions start the measured part together (a barrier), so wall time
    covers only concurrent calls. ``on_measure_start`` (no arguments) runs just
    before the barrier opens, to sample CPU counters. Raises ``CallError`` when
    a session cannot open or a warm-up call fails.
    """
    per_session = max(1, math.ceil(calls / sessions))
    warm_per_session = max(1, math.ceil(warmup_calls / sessions)) if warmup_calls > 0 else 0
    ready = 0
    all_ready = asyncio.Event()
    go = asyncio.Event()
    latencies: list[float] = []
    finished_at: list[float] = []
    errors = 0
    first_error: str | None = None
    payload = "x" * 32

    async def one_session() -> None:
        nonlocal ready, errors, first_error
        session = McpSession(target, mode, timeout_s=timeout_s)
        try:
            await session.open()
            for _ in range(warm_per_session):
                await session.call_echo(payload)
            ready += 1
            if ready == sessions:
                all_ready.set()
            await go.wait()
            for _ in range(per_session):
                started = time.perf_counter()
                try:
                    await session.call_echo(payload)
                except (CallError, httpx.HTTPError) as exc:
                    errors += 1
                    if first_error is None:
                        first_error = f"{type(exc).__name__}: {exc}"
                else:
                    latencies.append(time.perf_counter() - started)
            finished_at.append(time.perf_counter())
        finally:
            await session.close()

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(sessions):
                group.create_task(one_session())
            await all_ready.wait()
            if on_measure_start is not None:
                on_measure_start()
            measured_from = time.perf_counter()
            go.set()
    except BaseExceptionGroup as failures:
        # Surface the first real cause (a session that could not open or warm up), not the group.
        first: BaseException = failures
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from failures
    # Up to the last measured call, not the DELETEs that follow it.
    wall_s = max(finished_at) - measured_from
    return PhaseResult(
        label=target.label,
        sessions=sessions,
        calls=per_session * sessions,
        errors=errors,
        wall_s=wall_s,
        latencies_s=latencies,
        first_error=first_error,
    )
