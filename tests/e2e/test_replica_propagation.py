"""Two replicas in one process on one store: policy reloads travel, a replica behind shows (issue #10).

Each replica is the real app built from its own copy of the TOML file (as on
two hosts), on a loopback socket, with its own generation. A reload at one is
announced on the change feed; the other reloads its own file. When that file
cannot be used, the replica keeps its snapshot and shows as behind in
``/readyz`` (``policy_fleet``) and in ``bastion workers``.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bastion.app import create_app
from bastion.cli.main import main
from bastion.gateway import RuntimeOptions
from bastion.policy.load import load_snapshot
from tests.e2e.conftest import Upstream
from tests.e2e.issue4_support import (
    WAIT_S,
    FileGateway,
    base_config,
    bound_listener,
    readyz,
    reload_policy,
    serve_bound,
    write_config,
)
from tests.e2e.test_telemetry_e2e import scrape, value

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def replica(config_path: Path, data_dir: Path, generation: str) -> AsyncIterator[FileGateway]:
    app = create_app(load_snapshot(config_path), RuntimeOptions(data_dir=data_dir, generation=generation))
    async with serve_bound(app, bound_listener()) as url:
        yield FileGateway(url, app.state.gateway, config_path, data_dir)


async def policy_of(http: httpx.AsyncClient, gw: FileGateway) -> dict[str, Any]:
    _, ready = await readyz(http, gw.origin)
    return {"version": ready["policy_version"], **ready["policy_fleet"]}


async def until_version(http: httpx.AsyncClient, gw: FileGateway, version: str) -> dict[str, Any]:
    with anyio.fail_after(WAIT_S):
        while (policy := await policy_of(http, gw))["version"] != version:
            await anyio.sleep(0.05)
    return policy


def workers_table(data_dir: Path) -> str:
    """``bastion workers --data-dir``, through the CLI's entry point."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["workers", "--data-dir", str(data_dir), "--lease-s", "10"]) == 0
    return out.getvalue()


async def test_a_reload_at_one_replica_is_followed_by_the_other_and_a_lagging_one_shows_behind(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Reload at A: B follows with its own file; with B's file broken, B keeps its snapshot, shown behind."""
    config = base_config(tmp_path, tools_upstream.url)
    first_path, second_path = tmp_path / "a.toml", tmp_path / "b.toml"
    v1 = write_config(first_path, config)
    assert write_config(second_path, config) == v1
    data_dir = tmp_path / "data"
    async with (
        replica(first_path, data_dir, "gateway-1") as a,
        replica(second_path, data_dir, "gateway-2") as b,
        httpx.AsyncClient(timeout=30) as http,
    ):
        # (1) Both report v1; nobody is behind.
        fleet = await policy_of(http, a)
        assert fleet["newest"] == v1 and fleet["behind"] == [] and len(fleet["replicas"]) == 2

        # (2) The same edit on both hosts, a reload at A only: B follows within the feed's bound.
        config["gateway"]["upstream_timeout_s"] = 33.0
        v2 = write_config(first_path, config)
        assert write_config(second_path, config) == v2 != v1
        assert (await reload_policy(http, a.origin)).status_code == 200
        followed = await until_version(http, b, v2)
        assert followed["this_replica_behind"] is False
        # B's /metrics: one reload followed, within the feed's bound; A followed none (issue #25).
        lag = "bastion_policy_follow_lag_seconds"
        at_b, at_a = await scrape(http, b.url), await scrape(http, a.url)
        assert value(at_b, f"{lag}_count") == 1 and 0 < (value(at_b, f"{lag}_sum") or 0) < WAIT_S
        assert value(at_a, f"{lag}_count") == 0

        # (3) B's file is broken; the next reload at A is not followed there: B stays on v2, behind.
        config["gateway"]["upstream_timeout_s"] = 44.0
        v3 = write_config(first_path, config)
        second_path.write_text("[gateway\n")
        assert (await reload_policy(http, a.origin)).status_code == 200
        with anyio.fail_after(WAIT_S):
            while not (seen := await policy_of(http, a))["behind"]:
                await anyio.sleep(0.05)
        b_worker = b.gateway.membership.worker if b.gateway.membership else None
        assert seen["newest"] == v3 and seen["behind"] == [b_worker]
        assert (await policy_of(http, b))["this_replica_behind"] is True
        assert (await policy_of(http, b))["version"] == v2
        rows = [
            line
            for line in (await anyio.to_thread.run_sync(workers_table, data_dir)).splitlines()
            if str(b_worker) in line
        ]
        assert len(rows) == 1 and rows[0].rstrip().endswith(f"{v2} behind"), rows
        assert json.dumps(seen["replicas"][b_worker]["reload_error"])  # the reason is reported
