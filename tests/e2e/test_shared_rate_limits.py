"""Grant rate limits shared by replicas (issue #10): N per period holds across three gateways on one store.

Three real gateways (three generations) share one store, a SQLite file or a
PostgreSQL schema, as three replicas behind a load balancer would. One agent
calls a rate-limited tool through each in turn with the official SDK client:
the grant's budget is spent once, not once per replica.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import Upstream, gateway_config
from tests.e2e.issue4_support import sdk_client, static_token
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

REPLICAS = 3
RATE = 4


def config(tmp_path: Path, tools_url: str) -> dict[str, Any]:
    return {
        **gateway_config(tmp_path, tools_url),
        "grants": [
            {"name": "alice-count", "agent": "alice", "servers": ["tools"], "tools": ["count"],
             "rate": f"{RATE}/hour"},
        ],
    }  # fmt: skip


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_rate_limit_holds_across_three_replicas(
    request: pytest.FixtureRequest, engine: str, tmp_path: Path, tools_upstream: Upstream
) -> None:
    """4/hour through three replicas in turn: 4 calls run in all, every later one is rate_limited."""
    store_url = str(request.getfixturevalue("postgres_url")) if engine == "postgres" else None
    snapshot = snapshot_from_mapping(config(tmp_path, tools_upstream.url), source=None, version="t")
    outcomes: Counter[str] = Counter()
    with anyio.fail_after(120):
        async with contextlib.AsyncExitStack() as stack:
            urls = []
            for replica in range(REPLICAS):
                options = RuntimeOptions(
                    # SQLite replicas share the data directory's file; PostgreSQL ones only the URL.
                    data_dir=tmp_path / ("data" if store_url is None else f"data-{replica}"),
                    store_url=store_url,
                    generation=f"gateway-{replica}",
                )
                urls.append(await stack.enter_async_context(serve_on_loopback(create_app(snapshot, options))))
            clients = [
                await stack.enter_async_context(sdk_client(url, static_token("alice"))) for url in urls
            ]
            for n in range(RATE * REPLICAS):
                try:
                    result = await clients[n % REPLICAS].call_tool("tools__count", {})
                    outcomes["ran" if result.is_error is False else "error"] += 1
                except MCPError as exc:
                    outcomes[str((exc.error.data or {}).get("reason"))] += 1
    assert outcomes == {"ran": RATE, "rate_limited": RATE * (REPLICAS - 1)}
