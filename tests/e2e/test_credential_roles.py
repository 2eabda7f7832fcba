"""One credential, one role (issue #12 point 7): no secret is both a static agent's and another role's.

An agent token that is also the admin or an auditor token would administer the
gateway or read every agent's evidence; a static agent token that is also a
store credential would turn an expiring, revocable agent session into a
static agent. Each is refused at load, at reload, at start, and when the admin
API creates a credential.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from bastion.auth.bearer import hash_token
from bastion.errors import ConfigError
from bastion.gateway import Gateway, RuntimeOptions
from bastion.policy.load import load_snapshot, snapshot_from_mapping
from tests.e2e.conftest import Upstream
from tests.e2e.issue4_support import (
    ADMIN_TOKEN,
    AUDITOR_TOKEN,
    WAIT_S,
    base_config,
    bearer,
    create_agent_session,
    file_gateway,
    reload_policy,
    write_config,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("shared", "where", "other"),
    [
        pytest.param(ADMIN_TOKEN, "auth.admin_token_sha256", "agents.alice.token_sha256", id="admin"),
        pytest.param(
            AUDITOR_TOKEN, "auth.auditor_token_sha256[0]", "agents.alice.token_sha256", id="auditor"
        ),
    ],
)
def test_an_agent_token_that_is_another_roles_token_is_refused_at_load(
    tmp_path: Path, tools_upstream: Upstream, shared: str, where: str, other: str
) -> None:
    """An agent token equal to the admin or an auditor token fails to load, naming both key paths."""
    config = base_config(tmp_path, tools_upstream.url)
    config["agents"]["alice"]["token_sha256"] = hash_token(shared)
    with pytest.raises(ConfigError) as caught:
        snapshot_from_mapping(config, source=None, version="t")
    assert where in caught.value.message and other in caught.value.message


def test_the_admin_token_cannot_be_an_auditor_token(tmp_path: Path, tools_upstream: Upstream) -> None:
    """The admin credential listed among the auditors is refused; an auditor listed twice is not."""
    config = base_config(tmp_path, tools_upstream.url)
    config["auth"]["auditor_token_sha256"] = [hash_token(AUDITOR_TOKEN), hash_token(AUDITOR_TOKEN)]
    assert snapshot_from_mapping(config, source=None, version="t")
    config["auth"]["auditor_token_sha256"] = [hash_token(ADMIN_TOKEN)]
    with pytest.raises(ConfigError, match=r"auth\.auditor_token_sha256\[0\].*auth\.admin_token_sha256"):
        snapshot_from_mapping(config, source=None, version="t")


async def test_a_store_credential_never_becomes_a_static_agent(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A static agent token that is a store credential: refused at reload (old one stays) and at start."""
    path = tmp_path / "bastion.toml"
    config = base_config(tmp_path, tools_upstream.url)
    first_version = write_config(path, config)
    async with file_gateway(path, tmp_path / "data") as running, httpx.AsyncClient(timeout=WAIT_S) as http:
        session = await create_agent_session(http, running.origin)
        config["agents"]["mallory"] = {"token_sha256": hash_token(session.token)}
        write_config(path, config)
        refused = await reload_policy(http, running.origin)
        assert refused.status_code == 422, refused.text
        message = refused.json()["error"]["message"]
        assert "agents.mallory.token_sha256" in message and session.agent_session_id in message
        assert running.gateway.policy.current.version == first_version
    # The same file and store at start: the gateway does not come up.
    gateway = Gateway(
        load_snapshot(path), RuntimeOptions(data_dir=tmp_path / "data"), metrics=CollectorRegistry()
    )
    with anyio.fail_after(WAIT_S):
        async with anyio.create_task_group() as tg:
            with pytest.raises(ConfigError, match=r"agents\.mallory\.token_sha256"):
                await gateway.start(tg)
            await gateway.aclose()
            tg.cancel_scope.cancel()


async def test_the_admin_api_refuses_a_credential_that_holds_a_configured_role(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A certificate credential whose digest is the admin token digest: 409, nothing created."""
    path = tmp_path / "bastion.toml"
    write_config(path, base_config(tmp_path, tools_upstream.url))
    async with file_gateway(path, tmp_path / "data") as running, httpx.AsyncClient(timeout=WAIT_S) as http:
        response = await http.post(
            f"{running.origin}/admin/agent-sessions",
            headers=bearer(ADMIN_TOKEN),
            json={
                "agent": "carol",
                "human": "carol@example.com",
                "ttl_s": 600,
                "credential_kind": "mtls",
                "certificate_fingerprint": hash_token(ADMIN_TOKEN),
            },
        )
        assert response.status_code == 409, response.text
        assert response.json()["error"]["reason"] == "credential_holds_another_role"
        listed = await http.get(f"{running.origin}/admin/agent-sessions", headers=bearer(ADMIN_TOKEN))
    assert listed.json()["agent_sessions"] == []
