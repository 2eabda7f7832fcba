"""Choosing the store (issue #10): flag, then ``BASTION_STORE``, then ``[store] url``; no password shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.policy.load import snapshot_from_mapping
from bastion.store.dsn import redact_argv
from bastion.store.select import choose_store_url, describe_store

PG_A = "postgresql://app:pw-a@db-a/bastion"
PG_B = "postgres://app:pw-b@db-b/bastion"
PG_C = "postgresql://db-c/bastion"
SERVERS = {"servers": {"notes": {"command": "python"}}}


def test_the_flag_wins_then_the_environment_then_the_configuration() -> None:
    """Each source is used only when every earlier one is unset; none at all means the SQLite file."""
    env = {"BASTION_STORE": PG_B}
    assert choose_store_url(PG_A, env, PG_C) == PG_A
    assert choose_store_url(None, env, PG_C) == PG_B
    assert choose_store_url(None, {}, PG_C) == PG_C
    assert choose_store_url(None, {"BASTION_STORE": ""}, None) is None


def test_a_location_that_is_not_a_postgres_url_is_refused_without_its_password() -> None:
    """``mysql://`` (or a file path) is a configuration error that names its source, never the password."""
    with pytest.raises(ConfigError) as caught:
        choose_store_url(None, {"BASTION_STORE": "mysql://app:pw-x@db/bastion"})
    assert "BASTION_STORE" in caught.value.message and "pw-x" not in caught.value.message


def test_what_is_logged_about_a_store_has_no_password() -> None:
    """The store's description names its engine and place, with the password replaced."""
    assert describe_store(PG_A, Path("/d")) == "postgresql postgresql://app:***@db-a/bastion"
    assert describe_store(None, Path("/d")) == "sqlite /d/bastion.db"


def test_a_recorded_command_line_has_no_password() -> None:
    """Worker provenance records argv: URLs in it, bare or as ``--opt=URL``, are redacted."""
    argv = ["bastion", "serve", "--store", PG_A, f"--store={PG_B}", "--port", "0"]
    shown = redact_argv(argv)
    assert "pw-a" not in repr(shown) and "pw-b" not in repr(shown)
    assert shown[3] == "postgresql://app:***@db-a/bastion" and shown[4].startswith("--store=postgres://")


def test_the_store_table_of_the_configuration() -> None:
    """``[store] url`` takes ``${NAME}`` for its password and stays out of the snapshot's repr."""
    data = {**SERVERS, "store": {"url": "postgresql://app:${DB_PASSWORD}@db/bastion"}}
    snapshot = snapshot_from_mapping(data, source=None, version="v", environ={"DB_PASSWORD": "pw-z"})
    assert snapshot.store_url == "postgresql://app:pw-z@db/bastion"
    assert "pw-z" not in repr(snapshot)
    assert snapshot_from_mapping(SERVERS, source=None, version="v").store_url is None


@pytest.mark.parametrize(
    ("table", "complaint"),
    [({"url": "sqlite:///x.db"}, "postgresql://"), ({"uri": PG_C}, "unknown key"), ({"url": 5}, "string")],
)
def test_a_bad_store_table_is_refused(table: dict[str, object], complaint: str) -> None:
    """A non-PostgreSQL URL, an unknown key or a non-string url is a configuration error naming store."""
    with pytest.raises(ConfigError) as caught:
        snapshot_from_mapping({**SERVERS, "store": table}, source=None, version="v")
    assert "store" in caught.value.message and complaint in caught.value.message
