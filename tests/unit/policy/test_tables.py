"""Tests for policy/tables.py: the typed [gateway], [servers.*], [store] and [auth] tables word their
errors as policy/load.py always has, at the key path the file spells."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.policy.load import snapshot_from_mapping

SERVERS = {"notes": {"command": "python"}}
ISSUER = {"issuer": "https://issuer.example/", "jwks_url": "https://issuer.example/jwks"}


def refusal(section: str, table: Any) -> ConfigError:
    with pytest.raises(ConfigError) as excinfo:
        snapshot_from_mapping(
            {"servers": SERVERS, section: table} if section != "servers" else {"servers": table},
            source=Path("/etc/bastion.toml"),
            version="v",
            environ={},
        )
    return excinfo.value


@pytest.mark.parametrize(
    ("section", "table", "message"),
    [
        pytest.param(
            "auth",
            {"oauth": {**ISSUER, "leway_s": 5}},
            "auth.oauth.leway_s: unknown key (expected one of: agent_claims, agent_prefix, "
            "agent_session_claim, algorithms, audience, human_claims, issuer, jwks_url, leeway_s, "
            "scope_claims, team_claim)",
            id="unknown-key-in-a-nested-table",
        ),
        pytest.param(
            "auth", {"oauth": {"issuer": "https://i/"}}, "auth.oauth.jwks_url: missing key", id="missing-key"
        ),
        pytest.param(
            "auth",
            {"oauth": {**ISSUER, "agent_claims": ["sub", 7]}},
            "auth.oauth.agent_claims[1]: expected a string, got an integer",
            id="array-item-of-a-nested-table",
        ),
        pytest.param(
            "auth", {"oauth": "on"}, "auth.oauth: expected a table, got a string", id="nested-not-a-table"
        ),
        pytest.param(
            "gateway",
            {"keep_alive_s": float("inf")},
            "gateway.keep_alive_s: expected a finite number, got inf or nan",
            id="infinite-number",
        ),
        pytest.param(
            "gateway",
            {"allowed_hosts": {"localhost"}},
            "gateway.allowed_hosts: expected an array of strings, got a set",
            id="a-set-is-not-an-array",
        ),
        pytest.param(
            "gateway",
            {"max_body_bytes": None},
            "gateway.max_body_bytes: expected an integer, got a NoneType",
            id="explicit-none-is-a-wrong-type-not-absent",
        ),
        pytest.param(
            "auth",
            {"oauth": {**ISSUER, "leeway_s": None}},
            "auth.oauth.leeway_s: expected a number, got a NoneType",
            id="explicit-none-in-a-nested-table",
        ),
        pytest.param(
            "servers",
            {"notes": {"command": "python", "transparent": None}},
            "servers.notes.transparent: must be true or false",
            id="a-key-with-its-own-words",
        ),
        pytest.param(
            "servers",
            {"notes": {"url": "http://127.0.0.1:9000/mcp", "args": 3}},
            "servers.notes.args: only a stdio server (command) takes this key",
            id="a-key-of-the-other-kind-whatever-its-type",
        ),
        pytest.param(
            "servers",
            {"notes": {"command": "python", "max_processes": 2.0}},
            "servers.notes.max_processes: expected an integer, got a float",
            id="server-key-type",
        ),
        pytest.param(
            "agents",
            {"demo": {"anonymous": True, "token_sha256": 3}},
            "agents.demo.token_sha256: an anonymous agent has no token",
            id="a-token-beside-anonymous-whatever-its-type",
        ),
        pytest.param(
            "agents",
            {"demo": {"anonymous": "yes"}},
            "agents.demo.anonymous: must be true or false",
            id="anonymous-keeps-its-own-words",
        ),
        pytest.param(
            "store", {"url": 5}, "store.url: expected a string, got an integer", id="store-url-type"
        ),
    ],
)
def test_typed_tables_name_file_key_path_and_defect(section: str, table: Any, message: str) -> None:
    """A defect in a typed table is one ConfigError: the file, the key path as written, the defect."""
    error = refusal(section, table)

    assert error.message == f"/etc/bastion.toml: {message}"
    assert error.data["key"] == message.split(": ", 1)[0]


def test_an_already_parsed_mapping_may_hold_tuples_for_arrays() -> None:
    """The CLI's demo mapping may give a tuple where TOML gives an array: it reads the same."""
    snapshot = snapshot_from_mapping(
        {"servers": SERVERS, "gateway": {"allowed_hosts": ("localhost:8080",)}}, source=None, version="v"
    )

    assert snapshot.gateway.allowed_hosts == ("localhost:8080",)


def test_a_typed_table_never_echoes_a_value() -> None:
    """Values may be credentials: a wrong-typed value is named by its type only."""
    error = refusal("auth", {"admin_token_sha256": ["s3cr3t-value"]})

    assert "s3cr3t" not in error.message
    assert error.message.endswith("auth.admin_token_sha256: expected a string, got an array")
