"""Visibility (issue #5 point 7): ``GET /admin/workers``, session attachments, and ``bastion workers``.

The admin routes run in a Starlette app over ``httpx.ASGITransport`` (and on a
loopback socket for the CLI), on a real SQLite store; the clock is injected.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest
from starlette.applications import Starlette
from workers_support import HOST, LEASE_S, T0, Clock

from bastion.admin.api import AdminGate
from bastion.admin.workers import worker_routes
from bastion.auth.agent_session import token_digest
from bastion.cli.main import _parser, main
from bastion.cli.workers_cmd import COLUMNS, run_workers
from bastion.store.sqlite import SqliteStore
from bastion.workers.attachment import AttachmentTracker
from bastion.workers.liveness import pid_alive
from bastion.workers.registry import WorkerRole, register_identity
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

ADMIN_TOKEN = "admin-" + "w" * 40
EVIDENCE = {"pid": os.getpid(), "host": HOST, "started_by": "pytest", "config_version": "cfg-1"}


@dataclass
class Fleet:
    gateway: str
    runtime: str
    idle: str


async def populate(store: SqliteStore) -> Fleet:
    gateway = await register_identity(store, "gateway", WorkerRole.GATEWAY, EVIDENCE, now=T0)
    epoch = await store.claim_generation("g1", gateway.worker_id, now=T0, lease_s=LEASE_S)
    runtime = await register_identity(
        store, "upstream-notes", WorkerRole.UPSTREAM, {**EVIDENCE, "server": "notes"}, now=T0
    )
    await store.claim_generation("upstream:g1:notes", runtime.worker_id, now=T0, lease_s=LEASE_S)
    await store.record_attachment(
        runtime.worker_id, "ts_a", "notes", T0, writer=gateway.worker_id, epoch=epoch
    )
    idle = await register_identity(store, "upstream-tools", WorkerRole.UPSTREAM, EVIDENCE, now=T0)
    return Fleet(gateway.worker_id, runtime.worker_id, idle.worker_id)


def app_for(
    store: SqliteStore, clock: Clock, tracker: AttachmentTracker | None, digest: str | None
) -> Starlette:
    routes = worker_routes(
        store,
        AdminGate(digest),
        clock=clock,
        attachments=tracker,
        lease_s=LEASE_S,
        pid_alive=pid_alive,
        this_host=HOST,
    )
    return Starlette(routes=routes)


@pytest.fixture
async def admin(
    store: SqliteStore, clock: Clock
) -> AsyncIterator[tuple[httpx.AsyncClient, AttachmentTracker]]:
    tracker = AttachmentTracker()
    app = app_for(store, clock, tracker, token_digest(ADMIN_TOKEN))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://admin", headers=headers
    ) as c:
        yield c, tracker


async def test_workers_json_answers_every_column(
    store: SqliteStore, clock: Clock, admin: tuple[httpx.AsyncClient, AttachmentTracker]
) -> None:
    """GET /admin/workers answers every column: epoch, liveness, heartbeat age, provenance, owners, cohort."""
    fleet = await populate(store)
    clock.advance(2.5)
    client, _ = admin
    response = await client.get("/admin/workers")
    assert response.status_code == 200
    body = response.json()
    assert body["lease_s"] == LEASE_S and body["as_of"] == "2026-05-01T12:00:02.500000Z"
    workers = {w["worker_id"]: w for w in body["workers"]}
    runtime = workers[fleet.runtime]
    assert (runtime["role"], runtime["generation"], runtime["epoch"]) == ("upstream", "upstream:g1:notes", 1)
    assert (runtime["liveness"], runtime["heartbeat_age_s"]) == ("live", 2.5)
    assert runtime["provenance"]["server"] == "notes" and runtime["owning_sessions"] == ["ts_a"]
    assert (runtime["cohort"], runtime["cohort_live"], runtime["cohort_standing"]) == (
        "upstream",
        2,
        "member",
    )
    assert workers[fleet.idle]["owning_sessions"] == "unproven" and workers[fleet.idle]["generation"] is None


async def test_the_admin_credential_is_required(store: SqliteStore, clock: Clock) -> None:
    """No credential: 401; not configured at all: 403 admin_disabled (off unless turned on)."""
    on = app_for(store, clock, None, token_digest(ADMIN_TOKEN))
    off = app_for(store, clock, None, None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(on), base_url="http://admin") as client:
        assert (await client.get("/admin/workers")).status_code == 401
        wrong = await client.get("/admin/workers", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    async with httpx.AsyncClient(transport=httpx.ASGITransport(off), base_url="http://admin") as client:
        answer = await client.get("/admin/workers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert answer.status_code == 403 and answer.json()["error"]["reason"] == "admin_disabled"


async def test_session_attachments_show_both_facts_and_the_records(
    store: SqliteStore, admin: tuple[httpx.AsyncClient, AttachmentTracker]
) -> None:
    """Per namespace: connected, attached, condition; plus the ownership records. Unknown session: 404."""
    await populate(store)
    client, tracker = admin
    unknown = await client.get("/admin/sessions/ts_nobody/attachments")
    assert unknown.status_code == 404 and unknown.json()["error"]["reason"] == "transport_session_not_found"
    records_only = (await client.get("/admin/sessions/ts_a/attachments")).json()
    assert records_only["evidence"] == "unproven" and [
        r["namespace"] for r in records_only["ownership_records"]
    ] == ["notes"]
    tracker.upstream_connected("notes")
    tracker.upstream_disconnected("tools")
    tracker.surface_listed("ts_a", ["notes"], at=T0)
    body = (await client.get("/admin/sessions/ts_a/attachments")).json()
    by_namespace = {n["namespace"]: n for n in body["evidence"]}
    assert (by_namespace["notes"]["connected"], by_namespace["notes"]["attached"]) == (True, True)
    assert by_namespace["notes"]["condition"] is None
    assert by_namespace["tools"]["condition"] == "required_namespace_not_connected"


# ---------------------------------------------------------------- bastion workers


def parse(*argv: str) -> argparse.Namespace:
    # Only for the test that injects an HTTP client: the parser is bastion's own (cli/main.py).
    return _parser().parse_args(["workers", *argv])


def run(*argv: str) -> tuple[int, str, str]:
    """``bastion workers ARGV`` through the real entry point: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["workers", *argv])
    return code, out.getvalue(), err.getvalue()


async def test_cli_reads_the_store_file_directly(store: SqliteStore, tmp_path: Path) -> None:
    """--data-dir: the table has every column; ownership reads 'unproven' where nothing proves it."""
    fleet = await populate(store)
    # Liveness is judged now (wall clock) against these T0 records: a huge lease keeps them live.
    code, out, err = await anyio.to_thread.run_sync(
        lambda: run(*("--data-dir", str(tmp_path), "--lease-s", "1e10"))
    )
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == [c.upper() for c in COLUMNS]
    by_identity = {row.split()[0]: row for row in rows}
    assert "ts_a" in by_identity[fleet.runtime] and "live" in by_identity[fleet.runtime].split()
    assert "unproven" in by_identity[fleet.idle].split()
    assert "started_by=pytest" in by_identity[fleet.gateway]

    code, out, _ = await anyio.to_thread.run_sync(lambda: run(*("--data-dir", str(tmp_path), "--json")))
    assert code == 0 and {w["worker_id"] for w in json.loads(out)["workers"]} == {
        fleet.gateway,
        fleet.runtime,
        fleet.idle,
    }


def test_cli_refuses_unusable_arguments(tmp_path: Path) -> None:
    """No store there (never created), or --url without a token file: exit 2 and nothing created."""
    code, _, err = run("--data-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "no store" in err and not (tmp_path / "nowhere").exists()
    code, _, err = run("--url", "http://127.0.0.1:9")
    assert code == 2 and "--admin-token-file" in err
    with pytest.raises(SystemExit):
        parse("--url", "http://x", "--data-dir", str(tmp_path))


async def test_cli_reads_a_running_gateway_through_the_admin_api(
    store: SqliteStore, clock: Clock, tmp_path: Path
) -> None:
    """--url: the same table from GET /admin/workers; a wrong credential exits 1 with the reason."""
    fleet = await populate(store)
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    wrong_file = tmp_path / "wrong.token"
    wrong_file.write_text("not-the-token\n")
    app = app_for(store, clock, AttachmentTracker(), token_digest(ADMIN_TOKEN))
    async with serve_on_loopback(app) as url:
        code, out, _ = await anyio.to_thread.run_sync(
            lambda: run("--url", url, "--admin-token-file", str(token_file))
        )
        assert code == 0 and fleet.runtime in out and "ts_a" in out
        code, _, err = await anyio.to_thread.run_sync(
            lambda: run("--url", url, "--admin-token-file", str(wrong_file))
        )
        assert code == 1 and "credential_invalid" in err


def test_cli_reports_an_unreachable_gateway(tmp_path: Path) -> None:
    """A gateway that does not answer: exit 1, naming the address, never a traceback."""
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN_TOKEN)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    args = parse("--url", "http://127.0.0.1:9/mcp", "--admin-token-file", str(token_file))
    out, err = io.StringIO(), io.StringIO()
    with httpx.Client(transport=httpx.MockTransport(refuse)) as http:
        code = run_workers(args, http=http, out=out, err=err)
    assert code == 1 and "http://127.0.0.1:9" in err.getvalue()


async def test_reattach_is_the_sanctioned_recovery_over_the_admin_api(
    store: SqliteStore, clock: Clock
) -> None:
    """POST .../reattach runs the gateway's re-attach path and answers the evidence after it."""
    calls: list[tuple[str, str]] = []

    async def reattach_session(ref: str, namespace: str) -> list[str]:
        calls.append((ref, namespace))
        return ["notes"]

    tracker = AttachmentTracker(reattach_session=reattach_session)
    tracker.upstream_connected("notes")
    tracker.surface_listed("ts_a", [])
    app = app_for(store, clock, tracker, token_digest(ADMIN_TOKEN))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://a", headers=headers
    ) as c:
        answer = await c.post("/admin/sessions/ts_a/reattach", json={"namespace": "notes"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["evidence"]["condition"] is None and calls == [("ts_a", "notes")]
        for bad in ({}, {"namespace": ""}, {"namespace": "notes", "more": 1}, ["notes"]):
            refused = await c.post("/admin/sessions/ts_a/reattach", json=bad)
            assert refused.status_code == 400 and refused.json()["error"]["reason"] == "invalid_request"
        unknown = await c.post("/admin/sessions/ts_nobody/reattach", json={"namespace": "notes"})
        assert unknown.status_code == 404
    no_path = AttachmentTracker()
    no_path.surface_listed("ts_a", [])
    app = app_for(store, clock, no_path, token_digest(ADMIN_TOKEN))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://a", headers=headers
    ) as c:
        answer = await c.post("/admin/sessions/ts_a/reattach", json={"namespace": "notes"})
        assert answer.status_code == 409 and answer.json()["error"]["reason"] == "reattach_unavailable"


async def test_cli_judges_liveness_with_the_lease_each_gateway_recorded(
    store: SqliteStore, tmp_path: Path
) -> None:
    """Without --lease-s, `workers --data-dir` judges each worker by the lease its gateway recorded."""
    now = datetime.now(UTC)
    short = await register_identity(
        store, "gateway", WorkerRole.GATEWAY, {**EVIDENCE, "lease_s": 1.0}, now=now - timedelta(seconds=5)
    )
    long = await register_identity(
        store, "gateway", WorkerRole.GATEWAY, {**EVIDENCE, "lease_s": 600.0}, now=now - timedelta(seconds=60)
    )
    code, out, err = await anyio.to_thread.run_sync(lambda: run("--data-dir", str(tmp_path), "--json"))
    assert (code, err) == (0, "")
    liveness = {w["worker_id"]: w["liveness"] for w in json.loads(out)["workers"]}
    assert liveness == {short.worker_id: "expired", long.worker_id: "live"}
