"""Tests for policy/reload.py: atomic swaps, last valid snapshot kept, failures visible until fixed."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from bastion.auth.principal import Principal
from bastion.errors import ConfigError, GrantDenied
from bastion.ids import AgentId
from bastion.policy.decide import RateLimiter, decide
from bastion.policy.load import load_snapshot
from bastion.policy.reload import SnapshotHolder
from bastion.policy.snapshot import Snapshot

SERVERS = """
[servers.notes]
command = "python"
"""

READ_ONLY = (
    SERVERS
    + """
[[grants]]
agent = "demo"
servers = ["notes"]
tools = ["read_*"]
"""
)

READ_WRITE = READ_ONLY.replace('tools = ["read_*"]', 'tools = ["read_*", "write_note"]')

BROKEN = {
    "toml_syntax_error": READ_ONLY + "\n[[grants]\n",
    "unknown_server_in_grant": READ_ONLY.replace('servers = ["notes"]', 'servers = ["nowhere"]'),
    "bad_json_schema": READ_WRITE + '[grants.arguments_schema]\ntype = "objekt"\n',
}
EXPECTED = {
    "toml_syntax_error": "TOML syntax error",
    "unknown_server_in_grant": "grants[0].servers[0]: unknown server 'nowhere'",
    "bad_json_schema": "grants[0].arguments_schema: is not a valid JSON Schema",
}

DEMO = Principal(agent=AgentId("demo"))


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def decide_write(snapshot: Snapshot, limiter: RateLimiter) -> str:
    return decide(snapshot, DEMO, "notes", "notes", "write_note", {}, now=0.0, limiter=limiter).policy_version


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    return registry.get_sample_value(name, labels or {})


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "bastion.toml"
    write(path, READ_ONLY)
    return path


def test_reload_changes_a_decision_between_two_calls(config: Path) -> None:
    """A call denied under one snapshot is allowed under the next, each recording its own version."""
    holder = SnapshotHolder(load_snapshot(config), registry=CollectorRegistry())
    limiter = RateLimiter()
    first = holder.current
    with pytest.raises(GrantDenied) as excinfo:
        decide_write(holder.current, limiter)
    assert excinfo.value.data["policy_version"] == first.version

    write(config, READ_WRITE)
    second = holder.reload(lambda: load_snapshot(config))
    assert holder.current is second and holder() is second
    assert second.version != first.version
    assert decide_write(holder.current, limiter) == second.version
    # The snapshot a call already took keeps deciding it: the old object is unchanged.
    with pytest.raises(GrantDenied):
        decide_write(first, limiter)


@pytest.mark.parametrize("defect", sorted(BROKEN))
def test_invalid_reload_keeps_last_valid_snapshot_and_says_why(
    config: Path, defect: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A reload that fails validation leaves the snapshot in force; state, log and metric say why."""
    registry = CollectorRegistry()
    clock = Clock()
    holder = SnapshotHolder(load_snapshot(config), registry=registry, clock=clock)
    valid = holder.current
    assert holder.state() == {"policy_version": valid.version, "last_reload_error": None}

    write(config, BROKEN[defect])
    clock.now += 60
    with caplog.at_level(logging.WARNING, logger="bastion.policy"), pytest.raises(ConfigError):
        holder.reload(lambda: load_snapshot(config))

    assert holder.current is valid
    state = holder.state()
    assert state["policy_version"] == valid.version
    error = state["last_reload_error"]
    assert EXPECTED[defect] in error["message"]
    assert error["source"] == str(config)
    assert error["at"] == "2023-11-14T22:14:20+00:00"
    assert sample(registry, "bastion_policy_reloads_total", {"outcome": "failure"}) == 1.0
    assert sample(registry, "bastion_policy_reload_failing") == 1.0
    assert any(EXPECTED[defect] in record.getMessage() for record in caplog.records)
    # Calls are still decided by the last valid snapshot.
    with pytest.raises(GrantDenied):
        decide_write(holder.current, RateLimiter())


def test_failure_stays_visible_until_a_valid_reload(config: Path) -> None:
    """The failure record survives further failures and clears only when a valid snapshot arrives."""
    registry = CollectorRegistry()
    clock = Clock()
    holder = SnapshotHolder(load_snapshot(config), registry=registry, clock=clock)
    write(config, BROKEN["toml_syntax_error"])
    for _ in range(2):
        with pytest.raises(ConfigError):
            holder.reload(lambda: load_snapshot(config))
    assert holder.last_failure is not None
    assert sample(registry, "bastion_policy_reloads_total", {"outcome": "failure"}) == 2.0

    write(config, READ_WRITE)
    clock.now += 5
    new = holder.reload(lambda: load_snapshot(config))
    assert holder.state() == {"policy_version": new.version, "last_reload_error": None}
    assert holder.last_failure is None
    assert sample(registry, "bastion_policy_reload_failing") == 0.0
    assert sample(registry, "bastion_policy_reloads_total", {"outcome": "success"}) == 1.0
    assert sample(registry, "bastion_policy_last_success_timestamp_seconds") == clock.now


def test_two_holders_use_their_own_registries(config: Path) -> None:
    """Metrics go to the registry passed in: two gateways in one process do not collide."""
    first, second = CollectorRegistry(), CollectorRegistry()
    SnapshotHolder(load_snapshot(config), registry=first)
    SnapshotHolder(load_snapshot(config), registry=second)
    assert sample(first, "bastion_policy_reload_failing") == 0.0
    assert sample(second, "bastion_policy_reload_failing") == 0.0


def test_failure_source_can_be_named(config: Path, tmp_path: Path) -> None:
    """A reload from another file records that file as the source of the failure."""
    holder = SnapshotHolder(load_snapshot(config), registry=CollectorRegistry())
    other = tmp_path / "other.toml"
    write(other, "not toml [")
    with pytest.raises(ConfigError):
        holder.reload(lambda: load_snapshot(other), source=other)
    assert holder.state()["last_reload_error"]["source"] == str(other)


@pytest.mark.anyio
async def test_watch_reloads_on_change_and_records_a_bad_edit(config: Path) -> None:
    """The watcher reloads a changed file, records a broken edit, then picks up the fix."""
    holder = SnapshotHolder(load_snapshot(config), registry=CollectorRegistry())
    first = holder.current

    async def wait_until(predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(10):
            while not predicate():
                await anyio.sleep(0.01)

    def bump(text: str) -> None:
        write(config, text)
        # Make the change visible even on filesystems with coarse modification times.
        stat = config.stat()
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))

    async with anyio.create_task_group() as tg:
        await tg.start(partial(holder.watch, config, lambda: load_snapshot(config), interval_s=0.01))
        bump(BROKEN["toml_syntax_error"])
        await wait_until(lambda: holder.last_failure is not None)
        assert holder.current is first
        bump(READ_WRITE)
        await wait_until(lambda: holder.current is not first)
        assert holder.last_failure is None
        tg.cancel_scope.cancel()
