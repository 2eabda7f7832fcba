"""Client CPU per upstream request: Bastion's own client against httpx2 and aiohttp, same upstream, same load.

Starts the bundled example upstream (``bastion.examples.tools_server``) and sends it
``tools/call`` requests of the echo tool the way Bastion's upstream side does: one pooled
client, a streamed response read to its end, the JSON-RPC answer taken from the JSON body
or from the SSE stream. ``--era session`` opens one upstream session per worker (SSE
answers); ``--era sessionless`` sends independent 2026-07-28 requests (JSON answers).

Only this process's CPU is counted (``time.process_time``), per request, for each client
in turn, ``--rounds`` times alternating; the median per client is reported. Nothing else
runs in this process, so the figure is the client's own cost of a request (plus the
shared event loop). ``bastion`` is ``upstream/http_client.py`` (HTTP/1.1 on httptools,
what Bastion uses); httpx2 was Bastion's client before issue #13, aiohttp after it; aiohttp is
optional (a dev dependency): without it, it is left out.

    .venv/bin/python bench/upstream_clients.py --era session --requests 2000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2

from procs import Child

MODERN = "2026-07-28"
SESSION = "2025-11-25"
_ACCEPT = "application/json, text/event-stream"
_READY = re.compile(r"^LISTENING (http://\S+/mcp)$")

Post = Callable[[dict[str, str], bytes], Awaitable[tuple[int, dict[str, str], bytes]]]


def _answer(content_type: str, body: bytes) -> dict[str, Any]:
    if content_type.startswith("application/json"):
        message: dict[str, Any] = json.loads(body)
        return message
    for block in body.split(b"\n\n"):
        data = [line[5:].strip() for line in block.splitlines() if line.startswith(b"data:")]
        if data and data[0]:
            candidate = json.loads(b"\n".join(data))
            if "id" in candidate and "method" not in candidate:
                return dict(candidate)
    raise RuntimeError("no answer in the stream")


def _httpx2(url: str) -> tuple[Post, Callable[[], Awaitable[None]]]:
    client = httpx2.AsyncClient(
        timeout=httpx2.Timeout(30, connect=5.0),
        limits=httpx2.Limits(max_connections=256, max_keepalive_connections=128),
        follow_redirects=False,
        trust_env=False,
    )

    async def post(headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        request = client.build_request("POST", url, headers=headers, content=body)
        response = await client.send(request, stream=True)
        try:
            chunks = [chunk async for chunk in response.aiter_bytes()]
            return response.status_code, dict(response.headers), b"".join(chunks)
        finally:
            await response.aclose()

    return post, client.aclose


def _bastion(url: str) -> tuple[Post, Callable[[], Awaitable[None]]]:
    from bastion.upstream.http_client import UpstreamHttp

    client = UpstreamHttp(read_timeout_s=30, connect_timeout_s=5.0)

    async def post(headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        async with client.stream("POST", url, headers=headers, content=body) as response:
            chunks = [chunk async for chunk in response.aiter_bytes()]
            return response.status_code, dict(response.headers), b"".join(chunks)

    return post, client.aclose


def _aiohttp(url: str) -> tuple[Post, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=256, limit_per_host=256, keepalive_timeout=15),
        timeout=aiohttp.ClientTimeout(total=30, connect=5.0),
        auto_decompress=False,
        trust_env=False,
    )

    async def post(headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        async with session.post(url, headers=headers, data=body, allow_redirects=False) as response:
            chunks = [chunk async for chunk in response.content.iter_any()]
            return response.status, {k.lower(): v for k, v in response.headers.items()}, b"".join(chunks)

    return post, session.close


async def _worker(post: Post, era: str, count: int, counter: list[int]) -> None:
    base = {"accept": _ACCEPT, "content-type": "application/json"}
    if era == "session":
        init = {"protocolVersion": SESSION, "capabilities": {}, "clientInfo": {"name": "b", "version": "0"}}
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
        _, headers, _ = await post(base, json.dumps(body).encode())
        base = {**base, "mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": SESSION}
        await post(base, b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    else:
        base = {**base, "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "echo"}
    for n in range(count):
        params: dict[str, Any] = {"name": "echo", "arguments": {"text": "x" * 32}}
        if era == "sessionless":
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "b", "version": "0"},
            }
        body = {"jsonrpc": "2.0", "id": n + 1, "method": "tools/call", "params": params}
        status, headers, raw = await post(base, json.dumps(body).encode())
        answer = _answer(headers.get("content-type", ""), raw)
        if status != 200 or answer.get("id") != n + 1 or "result" not in answer:
            raise RuntimeError(f"bad answer {status}: {raw[:200]!r}")
        counter[0] += 1


async def _measure(name: str, url: str, args: argparse.Namespace) -> float:
    post, close = {"httpx2": _httpx2, "aiohttp": _aiohttp, "bastion": _bastion}[name](url)
    try:
        await asyncio.gather(*(_worker(post, args.era, 5, [0]) for _ in range(args.concurrency)))  # warm
        per = max(1, args.requests // args.concurrency)
        done = [0]
        cpu = time.process_time()
        await asyncio.gather(*(_worker(post, args.era, per, done) for _ in range(args.concurrency)))
        return (time.process_time() - cpu) / done[0] * 1e6
    finally:
        await close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--era", choices=["session", "sessionless"], default="session")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    clients = ["bastion", "httpx2"]
    try:
        import aiohttp  # noqa: F401

        clients.append("aiohttp")
    except ImportError:
        print("aiohttp not installed: left out")
    with tempfile.TemporaryDirectory() as temp:
        env = dict(os.environ, BASTION_COUNTER_FILE=str(Path(temp) / "counter"))
        argv = [sys.executable, "-m", "bastion.examples.tools_server", "--port", "0"]
        upstream = Child.start(
            "upstream", argv, ready=_READY, log_path=Path(temp) / "up.log", env=env, timeout_s=30
        )
        try:
            url = _READY.match(upstream.ready_line).group(1)  # type: ignore[union-attr]
            figures: dict[str, list[float]] = {name: [] for name in clients}
            for _ in range(args.rounds):
                for name in clients:
                    figures[name].append(asyncio.run(_measure(name, url, args)))
        finally:
            upstream.stop()
    print(f"era={args.era} requests={args.requests} concurrency={args.concurrency} rounds={args.rounds}")
    for name, values in figures.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:8s} client CPU/request median {statistics.median(values):6.0f} us  ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
