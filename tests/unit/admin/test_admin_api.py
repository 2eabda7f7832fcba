"""The admin API (DESIGN sections 1 and 8): its own credential, tokens shown once, revoke and renew.

A Starlette app holding only the admin routes, over ``httpx.ASGITransport``,
on a real SQLite store in ``tmp_path``; the clock is injected.
"""

from __future__ import annotations

import argparse
import io
import json
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from starlette.applications import Starlette

from bastion.admin.api import admin_routes
from bastion.auth.agent_session import StoreBearerAuth, token_digest
from bastion.cli.agent_session_cmd import run_agent_session
from bastion.cli.main import _parser
from bastion.errors import AgentSessionExpired, AgentSessionRevoked, Unauthenticated
from bastion.store.base import AgentSessionRecord
from bastion.store.sqlite import SqliteStore
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

ADMIN_TOKEN = "admin-" + "z" * 40
AGENT_TOKEN = "agent-" + "y" * 40
T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
CREATE = {
    "human": "ada@example.org",
    "agent": "agent-1",
    "team": "research",
    "scopes": ["tools:read"],
    "ttl_s": 3600,
}


@dataclass
class Admin:
    http: httpx.AsyncClient
    transport: httpx.ASGITransport
    store: SqliteStore
    now: list[datetime]
    revoked: list[AgentSessionRecord] = field(default_factory=list)

    async def create(self, **overrides: Any) -> dict[str, Any]:
        response = await self.http.post("/admin/agent-sessions", json={**CREATE, **overrides})
        assert response.status_code == 201, response.text
        return dict(response.json())


def admin_headers(token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    store = await SqliteStore.open(tmp_path / "admin.db")
    now = [T0]
    revoked: list[AgentSessionRecord] = []

    async def on_revoke(record: AgentSessionRecord) -> dict[str, Any]:
        revoked.append(record)
        return {"transport_sessions": 2, "in_flight_calls": 1}

    app = Starlette(
        routes=admin_routes(
            store, admin_token_sha256=token_digest(ADMIN_TOKEN), clock=lambda: now[0], on_revoke=on_revoke
        )
    )
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", headers=admin_headers()
        ) as http:
            yield Admin(http, transport, store, now, revoked)
    finally:
        await store.aclose()


# ---------------------------------------------------------------- the admin credential


@pytest.mark.parametrize(
    "headers",
    [{}, admin_headers(AGENT_TOKEN), {"Authorization": f"Basic {ADMIN_TOKEN}"}, {"Authorization": "Bearer"}],
    ids=["none", "agent-token", "basic", "empty"],
)
async def test_every_route_needs_the_admin_credential(admin: Admin, headers: dict[str, str]) -> None:
    """No credential, an agent's token or another scheme: 401 credential_invalid on every route."""
    record = await admin.create()
    session_id = record["agent_session"]["agent_session_id"]
    async with httpx.AsyncClient(
        transport=admin.transport, base_url="http://gateway", headers=headers
    ) as bare:
        for method, path in [
            ("POST", "/admin/agent-sessions"),
            ("GET", "/admin/agent-sessions"),
            ("GET", f"/admin/agent-sessions/{session_id}"),
            ("POST", f"/admin/agent-sessions/{session_id}/revoke"),
            ("POST", f"/admin/agent-sessions/{session_id}/renew"),
        ]:
            response = await bare.request(method, path, json={"by": "x"})
            assert response.status_code == 401, (method, path)
            assert response.json()["error"]["reason"] == "credential_invalid"
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert (await admin.store.get_agent_session(session_id)).revoked_at is None  # type: ignore[union-attr]
    assert len(await admin.store.list_agent_sessions()) == 1


async def test_an_agent_token_from_the_store_is_refused(admin: Admin) -> None:
    """A live agent credential minted by this API does not open the admin API."""
    token = (await admin.create())["token"]
    response = await admin.http.get("/admin/agent-sessions", headers=admin_headers(token))
    assert response.status_code == 401


async def test_admin_token_in_the_query_string_is_refused(admin: Admin) -> None:
    """The admin credential in the URL is refused even when it is right."""
    response = await admin.http.get(f"/admin/agent-sessions?access_token={ADMIN_TOKEN}", headers={})
    assert response.status_code == 401
    assert ADMIN_TOKEN not in response.text


async def test_without_a_configured_credential_the_api_is_off(tmp_path: Path) -> None:
    """No admin digest configured: every route answers 403 admin_disabled, whatever is presented."""
    async with await SqliteStore.open(tmp_path / "off.db") as store:
        app = Starlette(routes=admin_routes(store, admin_token_sha256=None, clock=lambda: T0))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway"
        ) as http:
            for method, path in [
                ("POST", "/admin/agent-sessions"),
                ("GET", "/admin/agent-sessions"),
                ("GET", "/admin/agent-sessions/as_x"),
                ("POST", "/admin/agent-sessions/as_x/revoke"),
                ("POST", "/admin/agent-sessions/as_x/renew"),
            ]:
                response = await http.request(method, path, json=CREATE, headers=admin_headers())
                assert response.status_code == 403
                assert response.json()["error"]["reason"] == "admin_disabled"
        assert await store.list_agent_sessions() == []


def test_a_malformed_admin_digest_is_refused_at_build() -> None:
    """A configured admin digest that is not a SHA-256 is a ValueError, not an open API."""
    with pytest.raises(ValueError):
        admin_routes(None, admin_token_sha256="admin-token", clock=lambda: T0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- create, list, show


async def test_create_returns_the_token_once(admin: Admin) -> None:
    """create answers 201 with the token (no-store); list and show never contain it or its digest."""
    response = await admin.http.post("/admin/agent-sessions", json=CREATE)
    assert response.status_code == 201
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    token = body["token"]
    session = body["agent_session"]
    assert session["state"] == "active"
    assert (session["human"], session["agent"], session["team"], session["scopes"]) == (
        "ada@example.org",
        "agent-1",
        "research",
        ["tools:read"],
    )
    assert (session["created_at"], session["expires_at"]) == ("2026-05-01T12:00:00Z", "2026-05-01T13:00:00Z")
    assert body["credential"]["kind"] == "bearer"

    listed = await admin.http.get("/admin/agent-sessions")
    shown = await admin.http.get(f"/admin/agent-sessions/{session['agent_session_id']}")
    for later in (listed, shown):
        assert later.status_code == 200
        assert token not in later.text and token_digest(token) not in later.text
    assert [s["agent_session_id"] for s in listed.json()["agent_sessions"]] == [session["agent_session_id"]]
    assert shown.json()["credentials"][0]["credential_id"] == body["credential"]["credential_id"]

    principal = await StoreBearerAuth(admin.store).authenticate(f"Bearer {token}", b"", T0)
    assert principal.agent_session_id == session["agent_session_id"]


async def test_list_filters_by_agent_and_shows_state(admin: Admin) -> None:
    """?agent= narrows the list; state follows the injected clock."""
    await admin.create()
    admin.now[0] = T0 + timedelta(seconds=1)
    await admin.create(agent="agent-2", ttl_s=10)
    admin.now[0] = T0 + timedelta(seconds=11)
    everyone = (await admin.http.get("/admin/agent-sessions")).json()["agent_sessions"]
    assert [(s["agent"], s["state"]) for s in everyone] == [("agent-1", "active"), ("agent-2", "expired")]
    only = (await admin.http.get("/admin/agent-sessions", params={"agent": "agent-2"})).json()
    assert [s["agent"] for s in only["agent_sessions"]] == ["agent-2"]


async def test_create_mtls_binds_the_fingerprint(admin: Admin) -> None:
    """An mtls credential stores the given fingerprint (normalized) and returns no token."""
    fingerprint = token_digest("certificate")
    colon_form = ":".join(fingerprint[i : i + 2] for i in range(0, 64, 2)).upper()
    body = await admin.create(credential_kind="mtls", certificate_fingerprint=colon_form)
    assert "token" not in body
    assert body["credential"]["certificate_fingerprint"] == fingerprint
    principal = await StoreBearerAuth(admin.store).principal_for_certificate(fingerprint, T0)
    assert principal.agent_session_id == body["agent_session"]["agent_session_id"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"human": ""},
        {"agent": None},
        {"ttl_s": 0},
        {"ttl_s": 10**9},
        {"scopes": "tools:read"},
        {"credential_kind": "password"},
        {"credential_kind": "mtls"},
        {"credential_kind": "mtls", "certificate_fingerprint": "ab:cd"},
        {"certificate_fingerprint": "a" * 64},
        {"unexpected": 1},
    ],
)
async def test_invalid_create_is_400_and_writes_nothing(admin: Admin, overrides: dict[str, Any]) -> None:
    """A malformed create answers 400 invalid_request and creates no agent session."""
    response = await admin.http.post("/admin/agent-sessions", json={**CREATE, **overrides})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["reason"] == "invalid_request"
    assert await admin.store.list_agent_sessions() == []


async def test_body_that_is_not_json_is_400(admin: Admin) -> None:
    """A create body that is not JSON is refused as invalid_request."""
    response = await admin.http.post(
        "/admin/agent-sessions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["reason"] == "invalid_request"


async def test_unknown_agent_session_is_404(admin: Admin) -> None:
    """show, revoke and renew of an unknown id answer 404 agent_session_not_found."""
    for method, path in [
        ("GET", "/admin/agent-sessions/as_nope"),
        ("POST", "/admin/agent-sessions/as_nope/revoke"),
        ("POST", "/admin/agent-sessions/as_nope/renew"),
    ]:
        response = await admin.http.request(method, path, json={"by": "ops"})
        assert response.status_code == 404
        assert response.json()["error"]["reason"] == "agent_session_not_found"
    assert admin.revoked == []


# ---------------------------------------------------------------- revoke


async def test_revoke_calls_on_revoke_and_returns_its_summary(admin: Admin) -> None:
    """Revocation is durable, on_revoke gets the revoked record, and its summary is in the answer."""
    created = await admin.create()
    session_id = created["agent_session"]["agent_session_id"]
    admin.now[0] = T0 + timedelta(seconds=30)
    response = await admin.http.post(
        f"/admin/agent-sessions/{session_id}/revoke", json={"by": "sec-ops", "reason": "laptop lost"}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["ended"] == {"transport_sessions": 2, "in_flight_calls": 1}
    assert body["already_revoked"] is False
    session = body["agent_session"]
    assert (session["state"], session["revoked_by"], session["revoke_reason"]) == (
        "revoked",
        "sec-ops",
        "laptop lost",
    )
    assert session["revoked_at"] == "2026-05-01T12:00:30Z"
    assert [r.agent_session_id for r in admin.revoked] == [session_id]
    assert admin.revoked[0].revoked_by == "sec-ops"
    with pytest.raises(AgentSessionRevoked):
        await StoreBearerAuth(admin.store).authenticate(f"Bearer {created['token']}", b"", admin.now[0])


async def test_revoke_again_keeps_the_first_and_cuts_again(admin: Admin) -> None:
    """A repeated revoke keeps the first record, says so, and calls on_revoke again."""
    session_id = (await admin.create())["agent_session"]["agent_session_id"]
    path = f"/admin/agent-sessions/{session_id}/revoke"
    await admin.http.post(path, json={"by": "first", "reason": "a"})
    admin.now[0] = T0 + timedelta(seconds=5)
    again = (await admin.http.post(path, json={"by": "second", "reason": "b"})).json()
    assert again["already_revoked"] is True
    assert (again["agent_session"]["revoked_by"], again["agent_session"]["revoked_at"]) == (
        "first",
        "2026-05-01T12:00:00Z",
    )
    assert len(admin.revoked) == 2


async def test_revoke_needs_an_actor(admin: Admin) -> None:
    """A revoke without ``by`` is 400 and revokes nothing."""
    session_id = (await admin.create())["agent_session"]["agent_session_id"]
    response = await admin.http.post(f"/admin/agent-sessions/{session_id}/revoke", json={"reason": "x"})
    assert response.status_code == 400
    assert (await admin.store.get_agent_session(session_id)).revoked_at is None  # type: ignore[union-attr]
    assert admin.revoked == []


async def test_failed_cut_still_leaves_the_revocation_durable(tmp_path: Path) -> None:
    """If on_revoke fails, the answer is 500 revocation_not_propagated and the session stays revoked."""

    async def broken(record: AgentSessionRecord) -> dict[str, Any]:
        raise RuntimeError("gateway busy")

    async with await SqliteStore.open(tmp_path / "cut.db") as store:
        routes = admin_routes(
            store, admin_token_sha256=token_digest(ADMIN_TOKEN), clock=lambda: T0, on_revoke=broken
        )
        transport = httpx.ASGITransport(app=Starlette(routes=routes))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://g", headers=admin_headers()
        ) as http:
            created = (await http.post("/admin/agent-sessions", json=CREATE)).json()
            session_id = created["agent_session"]["agent_session_id"]
            response = await http.post(f"/admin/agent-sessions/{session_id}/revoke", json={"by": "ops"})
        assert response.status_code == 500
        assert response.json()["error"]["reason"] == "revocation_not_propagated"
        assert response.json()["agent_session"]["state"] == "revoked"
        assert (await store.get_agent_session(session_id)).revoked_by == "ops"  # type: ignore[union-attr]


# ---------------------------------------------------------------- renew


async def test_renew_supersedes_the_old_token(admin: Admin) -> None:
    """renew returns a new token once; the old one stops authenticating, the new one works, same session."""
    created = await admin.create()
    session_id = created["agent_session"]["agent_session_id"]
    admin.now[0] = T0 + timedelta(minutes=10)
    response = await admin.http.post(f"/admin/agent-sessions/{session_id}/renew", json={})
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["superseded"] == created["credential"]["credential_id"]
    assert body["credential"]["renewed_from"] == created["credential"]["credential_id"]
    new_token = body["token"]
    assert new_token != created["token"]

    auth = StoreBearerAuth(admin.store)
    with pytest.raises(Unauthenticated):
        await auth.authenticate(f"Bearer {created['token']}", b"", admin.now[0])
    principal = await auth.authenticate(f"Bearer {new_token}", b"", admin.now[0])
    assert principal.agent_session_id == session_id
    assert principal.expires_at == T0 + timedelta(hours=1)  # renewal extends nothing

    shown = (await admin.http.get(f"/admin/agent-sessions/{session_id}")).json()
    assert [c["superseded_at"] is not None for c in shown["credentials"]] == [True, False]


async def test_renewing_a_superseded_credential_is_a_conflict(admin: Admin) -> None:
    """Naming an already superseded credential answers 409 conflict."""
    created = await admin.create()
    session_id = created["agent_session"]["agent_session_id"]
    path = f"/admin/agent-sessions/{session_id}/renew"
    await admin.http.post(path, json={})
    again = await admin.http.post(path, json={"credential_id": created["credential"]["credential_id"]})
    assert again.status_code == 409
    assert again.json()["error"]["reason"] == "conflict"
    unknown = await admin.http.post(path, json={"credential_id": "cred_nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["reason"] == "credential_not_found"


@pytest.mark.parametrize("revoke", [True, False])
async def test_renew_of_an_unusable_session_is_refused(admin: Admin, revoke: bool) -> None:
    """A revoked or expired agent session renews nothing: 409 with the session's own reason."""
    created = await admin.create()
    session_id = created["agent_session"]["agent_session_id"]
    if revoke:
        await admin.http.post(f"/admin/agent-sessions/{session_id}/revoke", json={"by": "ops"})
    else:
        admin.now[0] = T0 + timedelta(hours=1)
    response = await admin.http.post(f"/admin/agent-sessions/{session_id}/renew", json={})
    assert response.status_code == 409
    assert response.json()["error"]["reason"] == (
        "agent_session_revoked" if revoke else "agent_session_expired"
    )
    assert "token" not in response.json()


async def test_renew_mtls_takes_the_new_fingerprint(admin: Admin) -> None:
    """An mtls credential renews to the given fingerprint; without one it is 400."""
    old, new = token_digest("cert-1"), token_digest("cert-2")
    created = await admin.create(credential_kind="mtls", certificate_fingerprint=old)
    path = f"/admin/agent-sessions/{created['agent_session']['agent_session_id']}/renew"
    assert (await admin.http.post(path, json={})).status_code == 400
    body = (await admin.http.post(path, json={"certificate_fingerprint": new})).json()
    assert body["credential"]["certificate_fingerprint"] == new
    assert "token" not in body
    auth = StoreBearerAuth(admin.store)
    with pytest.raises(Unauthenticated):
        await auth.principal_for_certificate(old, T0)
    assert (await auth.principal_for_certificate(new, T0)).agent == "agent-1"


async def test_expired_session_still_authenticates_as_expired(admin: Admin) -> None:
    """Past its ttl the token resolves to AgentSessionExpired, not to an unknown credential."""
    token = (await admin.create(ttl_s=60))["token"]
    with pytest.raises(AgentSessionExpired):
        await StoreBearerAuth(admin.store).authenticate(f"Bearer {token}", b"", T0 + timedelta(seconds=60))


async def test_errors_are_json_with_a_reason(admin: Admin) -> None:
    """Every refusal body is {"error": {"reason", "message"}}."""
    response = await admin.http.post("/admin/agent-sessions", json={})
    body = json.loads(response.text)
    assert set(body["error"]) >= {"reason", "message"}


# ---------------------------------------------------------------- the CLI against a live admin API


def cli(*argv: str) -> argparse.Namespace:
    """Arguments as ``bastion`` itself parses them (cli/main.py), never a parser built here."""
    return _parser().parse_args(list(argv))


async def test_cli_drives_the_admin_api(tmp_path: Path) -> None:
    """create (token to a 0600 file), list, show, renew and revoke through ``bastion agent-session``."""
    admin_file = tmp_path / "admin.token"
    admin_file.write_text(ADMIN_TOKEN + "\n")
    token_file = tmp_path / "agent.token"

    async def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        args = cli(*argv[:2], "--url", url, "--admin-token-file", str(admin_file), *argv[2:])
        code = await anyio.to_thread.run_sync(lambda: run_agent_session(args, out=out, err=err))
        return code, out.getvalue(), err.getvalue()

    async with await SqliteStore.open(tmp_path / "cli.db") as store:
        app = Starlette(
            routes=admin_routes(store, admin_token_sha256=token_digest(ADMIN_TOKEN), clock=lambda: T0)
        )
        async with serve_on_loopback(app) as url:
            code, out, err = await run(
                "agent-session", "create", "--human", "ada", "--agent", "agent-1", "--scope", "a",
                "--scope", "b", "--ttl", "2h", "--token-out", str(token_file),
            )  # fmt: skip
            assert code == 0, err
            token = token_file.read_text().strip()
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            assert token not in out
            session_id = next(
                line.split()[1] for line in out.splitlines() if line.startswith("agent_session_id")
            )
            principal = await StoreBearerAuth(store).authenticate(f"Bearer {token}", b"", T0)
            assert principal.scopes == frozenset({"a", "b"})
            assert principal.expires_at == T0 + timedelta(hours=2)

            code, out, _ = await run("agent-session", "list")
            assert code == 0 and session_id in out and "STATE" in out.splitlines()[0]

            code, out, _ = await run("agent-session", "show", session_id, "--json")
            assert code == 0 and json.loads(out)["agent_session"]["agent_session_id"] == session_id

            code, out, _ = await run("agent-session", "renew", session_id, "--token-out", str(token_file))
            assert code == 0
            assert token_file.read_text().strip() != token

            code, out, _ = await run("agent-session", "revoke", session_id, "--by", "ops", "--reason", "done")
            assert code == 0 and "revoked" in out

            code, _, err = await run("agent-session", "show", "as_nope")
            assert code == 1 and "agent_session_not_found" in err

            admin_file.write_text(AGENT_TOKEN)
            code, _, err = await run("agent-session", "list")
            assert code == 1 and "credential_invalid" in err
            assert AGENT_TOKEN not in err
