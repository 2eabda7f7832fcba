"""Catalogs per client capability set are bounded, least recently used first, and dropped at a list
change (upstream/fleet.py, issue 22). The upstream is the bundled example server on a loopback socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from bastion.examples.counter import FileCounter
from bastion.examples.tools_server import build_app, build_server
from bastion.policy.load import snapshot_from_mapping
from bastion.upstream.capability_sets import bridged_capabilities, capability_key, capability_set
from bastion.upstream.fleet import MAX_CAPABILITY_SETS, UpstreamFleet
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio


def test_only_bridgeable_capabilities_as_declared_name_a_set() -> None:
    """Bastion declares upstream only roots, sampling and elicitation, exactly as the client did."""
    declared = {
        "roots": {"listChanged": True},
        "elicitation": {"form": {}, "url": {}},
        "experimental": {"x": {}},
    }
    assert bridged_capabilities(declared) == {
        "roots": {"listChanged": True},
        "elicitation": {"form": {}, "url": {}},
    }
    assert capability_key({"experimental": {}}) == ""
    assert capability_key({"roots": {}, "sampling": {}}) == capability_key({"sampling": {}, "roots": {}})
    assert capability_key({"elicitation": {"form": {}}}) != capability_key(
        {"elicitation": {"form": {}, "url": {}}}
    )
    # What the schema does not define names no new set: a client cannot make sets without bound.
    listing = {"roots": {"listChanged": True}}
    assert capability_key({"roots": {"listChanged": True, "x": 1}}) == capability_key(listing)
    assert capability_key({"roots": {"listChanged": False}}) != capability_key(listing)
    assert capability_set({"roots": {"listChanged": True, "x": 1}, "sampling": {"tools": {"y": 2}}}) == {
        "roots": {"listChanged": True},
        "sampling": {"tools": {}},
    }


@pytest.mark.parametrize("era", ["session", "sessionless"])
async def test_capability_set_catalogs_are_bounded_and_dropped_at_a_list_change(
    tmp_path: Path, era: str
) -> None:
    """Past ``MAX_CAPABILITY_SETS`` the least recently used set goes; a refresh drops them all; a client
    with no bridgeable capability is served the catalog itself."""
    app = build_app(build_server(FileCounter(tmp_path / "counter")), host="127.0.0.1", json_response=False)
    with anyio.fail_after(60):
        async with serve_on_loopback(app) as url, anyio.create_task_group() as tg:
            snapshot = snapshot_from_mapping(
                {"servers": {"tools": {"url": url, "era": era}}}, source=None, version="test"
            )
            fleet = UpstreamFleet(snapshot)
            await fleet.start(tg)
            assert await fleet.view_for({}) is fleet.catalog
            modes: list[dict[str, Any]] = [{}, {"form": {}}, {"url": {}}, {"form": {}, "url": {}}]
            roots: list[dict[str, Any]] = [{}, {"listChanged": True}, {"listChanged": False}]
            sets = [
                {"elicitation": e, "roots": r, **({"sampling": {}} if n else {})}
                for n in (0, 1)
                for e in modes
                for r in roots
            ][: MAX_CAPABILITY_SETS + 1]
            assert len({capability_key(c) for c in sets}) == MAX_CAPABILITY_SETS + 1
            for declared in sets:
                view = await fleet.view_for(declared)
                assert set(view) == set(fleet.catalog)  # this upstream shows everyone the same tools
            assert len(fleet.capability_sets) == MAX_CAPABILITY_SETS
            assert capability_key(sets[0]) not in fleet.capability_sets  # the least recently used went
            await fleet.view_for(sets[1])
            assert fleet.capability_sets[-1] == capability_key(sets[1])  # used: now the most recent
            await fleet.refresh_server("tools")
            assert fleet.capability_sets == ()
            await fleet.aclose()
            tg.cancel_scope.cancel()
