"""Tests for policy/grants.py and the ``[[grants]]`` section of policy/load.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bastion.errors import ConfigError
from bastion.policy.grants import Grant, Rate, Subject, SubjectKind, check_arguments_schema
from bastion.policy.load import load_snapshot
from bastion.policy.snapshot import Snapshot

SERVERS = """
[servers.notes]
command = "python"
namespace = "memo"

[servers.tools]
url = "http://127.0.0.1:9000/mcp"
"""

GRANTS = """
[[grants]]
name = "writers"
agent = "demo"
servers = ["notes"]
tools = ["write_*", "read_note"]
require_execution_id = true
rate = "10/minute"

[grants.arguments_schema]
type = "object"
required = ["title"]
properties.title = { type = "string", maxLength = 20 }

[[grants]]
team = "ops"
namespaces = ["memo"]
servers = ["tools"]
tools = ["*"]

[[grants]]
scope = "notes:read"
servers = ["notes"]
tools = ["read_note"]

[[grants]]
human = "alice@example.com"
servers = ["tools"]
tools = ["add"]
"""


def load(tmp_path: Path, text: str) -> Snapshot:
    path = tmp_path / "bastion.toml"
    path.write_text(text, encoding="utf-8")
    return load_snapshot(path, environ={})


def load_error(tmp_path: Path, grants: str) -> str:
    path = tmp_path / "bastion.toml"
    path.write_text(SERVERS + grants, encoding="utf-8")
    with pytest.raises(ConfigError) as excinfo:
        load_snapshot(path, environ={})
    return excinfo.value.message


def test_grants_load_into_frozen_grants(tmp_path: Path) -> None:
    """Every documented key of a grant reaches the snapshot, in file order."""
    snapshot = load(tmp_path, SERVERS + GRANTS)
    grants = snapshot.grants
    assert [g.name for g in grants] == ["writers", "grants[1]", "grants[2]", "grants[3]"]
    writers = grants[0]
    assert writers.subject == Subject(SubjectKind.AGENT, "demo")
    assert writers.servers == frozenset({"notes"})
    assert writers.tools == ("write_*", "read_note")
    assert writers.require_execution_id is True
    assert writers.rate == Rate(tokens=10, period_s=60.0)
    assert writers.arguments_schema is not None
    assert writers.arguments_schema["required"] == ("title",)
    assert grants[1].subject.kind is SubjectKind.TEAM
    assert grants[1].namespaces == frozenset({"memo"})
    assert grants[2].subject == Subject(SubjectKind.SCOPE, "notes:read")
    assert grants[3].subject == Subject(SubjectKind.HUMAN, "alice@example.com")
    assert grants[3].rate is None and grants[3].require_execution_id is False


def test_no_grants_key_means_no_grants_declared(tmp_path: Path) -> None:
    """A file without [[grants]] compiles to an empty grants tuple (the compatibility mode)."""
    assert load(tmp_path, SERVERS).grants == ()


def test_grant_schema_is_frozen_against_later_mutation() -> None:
    """Changing the dict a grant was built from changes nothing in the grant."""
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}
    grant = Grant(
        name="g",
        subject=Subject(SubjectKind.AGENT, "a"),
        tools=("t",),
        servers=frozenset({"s"}),
        arguments_schema=schema,
    )
    schema["properties"]["n"]["maximum"] = 1000
    assert grant.argument_violation({"n": 5}) == "properties/n/maximum"
    with pytest.raises(TypeError):
        grant.arguments_schema["type"] = "array"  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "tokens", "period_s"),
    [("1/second", 1, 1.0), ("10/minute", 10, 60.0), (" 5 / hour ", 5, 3600.0), ("100/day", 100, 86400.0)],
)
def test_rate_parses_count_and_period(text: str, tokens: int, period_s: float) -> None:
    """A rate is N per second, minute, hour or day."""
    assert Rate.parse(text) == Rate(tokens, period_s)


@pytest.mark.parametrize("text", ["10", "0/minute", "10/fortnight", "-1/second", "ten/minute", "1.5/second"])
def test_rate_refuses_malformed_text(text: str) -> None:
    """Anything but a positive integer over a known period is a ConfigError."""
    with pytest.raises(ConfigError):
        Rate.parse(text)


def test_subject_star_only_for_agents() -> None:
    """'*' names every agent; for team, human or scope it is refused."""
    assert Subject(SubjectKind.AGENT, "*").covers(agent="x", team=None, human=None, scopes=frozenset())
    for kind in (SubjectKind.TEAM, SubjectKind.HUMAN, SubjectKind.SCOPE):
        with pytest.raises(ConfigError):
            Subject(kind, "*")


def test_check_arguments_schema_names_place_not_value() -> None:
    """A bad schema is reported by place and rule, without quoting the schema's values."""
    with pytest.raises(ConfigError) as excinfo:
        check_arguments_schema({"properties": {"title": {"type": "strng-secret"}}})
    assert "properties/title/type" in excinfo.value.message
    assert "strng-secret" not in excinfo.value.message


# ---------------------------------------------------------------- loader errors, named for their defect


def test_unknown_server_in_grant_names_key_path(tmp_path: Path) -> None:
    """A grant naming an undeclared server is refused at grants[i].servers[j]."""
    message = load_error(tmp_path, '[[grants]]\nagent = "a"\nservers = ["notes", "nope"]\ntools = ["*"]\n')
    assert "grants[0].servers[1]: unknown server 'nope'" in message


def test_unknown_namespace_in_grant_names_key_path(tmp_path: Path) -> None:
    """A namespace is checked against namespaces, not server names ("notes" is the server of "memo")."""
    message = load_error(tmp_path, '[[grants]]\nagent = "a"\nnamespaces = ["notes"]\ntools = ["*"]\n')
    assert "grants[0].namespaces[0]: unknown namespace 'notes'" in message


def test_bad_schema_names_key_path(tmp_path: Path) -> None:
    """An arguments_schema that is not valid JSON Schema is refused at load, with its key path."""
    message = load_error(
        tmp_path,
        '[[grants]]\nagent = "a"\nservers = ["notes"]\ntools = ["*"]\n'
        '[grants.arguments_schema]\ntype = "objekt"\n',
    )
    assert "grants[0].arguments_schema: is not a valid JSON Schema at type" in message


def test_unknown_schema_dialect_is_refused(tmp_path: Path) -> None:
    """A $schema outside the known drafts is refused rather than read under another draft's rules."""
    message = load_error(
        tmp_path,
        '[[grants]]\nagent = "a"\nservers = ["notes"]\ntools = ["*"]\n'
        '[grants.arguments_schema]\n"$schema" = "https://example.com/my-dialect"\n',
    )
    assert "grants[0].arguments_schema" in message and "unknown dialect" in message


@pytest.mark.parametrize(
    ("grant", "expected"),
    [
        ('agent = "a"\nteam = "t"\nservers = ["notes"]\ntools = ["*"]', "exactly one subject key"),
        (
            'servers = ["notes"]\ntools = ["*"]',
            "exactly one subject key: agent, team, human or scope (found: none)",
        ),
        ('team = "*"\nservers = ["notes"]\ntools = ["*"]', 'grants[0].team: "*" (everyone)'),
        ('agent = ""\nservers = ["notes"]\ntools = ["*"]', "grants[0].agent: must be a non-empty"),
        ('agent = "a"\ntools = ["*"]', "a grant needs a non-empty servers or namespaces"),
        ('agent = "a"\nservers = []\ntools = ["*"]', "a grant needs a non-empty servers or namespaces"),
        ('agent = "a"\nservers = ["notes"]', "grants[0].tools: missing key"),
        ('agent = "a"\nservers = ["notes"]\ntools = []', "grants[0].tools: must not be empty"),
        ('agent = "a"\nservers = ["notes"]\ntools = [""]', "grants[0].tools[0]: must be a non-empty"),
        ('agent = "a"\nservers = ["notes"]\ntools = "*"', "grants[0].tools: expected an array"),
        ('agent = "a"\nservers = ["notes"]\ntools = ["*"]\nrate = "lots"', "grants[0].rate: a rate must"),
        ('agent = "a"\nservers = ["notes"]\ntools = ["*"]\nrate = 10', "grants[0].rate: expected a string"),
        (
            'agent = "a"\nservers = ["notes"]\ntools = ["*"]\nrequire_execution_id = "yes"',
            "grants[0].require_execution_id: expected a boolean",
        ),
        ('agent = "a"\nservers = ["notes"]\ntools = ["*"]\ntool = ["x"]', "grants[0].tool: unknown key"),
        ('agent = "a"\nservers = ["notes"]\ntools = ["*"]\nname = "no spaces"', "grants[0].name: a grant"),
        (
            'agent = "a"\nservers = ["notes"]\ntools = ["*"]\narguments_schema = "x"',
            "grants[0].arguments_schema: expected a table",
        ),
    ],
)
def test_malformed_grant_is_refused_with_key_path(tmp_path: Path, grant: str, expected: str) -> None:
    """Each defect of a grant stops loading with a message naming where it is."""
    assert expected in load_error(tmp_path, "[[grants]]\n" + grant + "\n")


def test_duplicate_grant_names_are_refused(tmp_path: Path) -> None:
    """Two grants with one name would share audit names and rate buckets: refused."""
    one = '[[grants]]\nname = "g"\nagent = "a"\nservers = ["notes"]\ntools = ["*"]\n'
    assert "grants[1].name: repeats the name of grants[0]" in load_error(tmp_path, one + one)


def test_empty_grants_array_is_refused(tmp_path: Path) -> None:
    """`grants = []` is neither "no grants declared" nor a useful policy: refused as ambiguous."""
    path = tmp_path / "bastion.toml"
    path.write_text("grants = []\n" + SERVERS, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"grants: is empty"):
        load_snapshot(path, environ={})


def test_grants_must_be_an_array_of_tables(tmp_path: Path) -> None:
    """A [grants] table instead of [[grants]] is refused."""
    assert "grants: expected an array of tables" in load_error(tmp_path, "[grants]\nagent = 'a'\n")


def test_a_grant_may_name_only_resources_or_prompts(tmp_path: Path) -> None:
    """``resources`` and ``prompts`` patterns load without ``tools``; such a grant covers no tool."""
    snapshot = load(
        tmp_path,
        SERVERS
        + '[[grants]]\nagent = "a"\nservers = ["notes"]\nresources = ["doc://*"]\nprompts = ["greet"]\n',
    )
    grant = snapshot.grants[0]
    assert grant.resources == ("doc://*",) and grant.prompts == ("greet",) and grant.tools == ()
    assert grant.covers_resource("notes", "notes", "doc://readme")
    assert not grant.covers_resource("notes", "notes", "file:///etc/passwd")
    assert grant.covers_prompt("notes", "notes", "greet") and not grant.covers_prompt("notes", "notes", "x")
    assert not grant.covers_target("notes", "notes", "greet")


@pytest.mark.parametrize(
    ("grant", "expected"),
    [
        ('agent = "a"\nservers = ["notes"]\nresources = [""]', "grants[0].resources[0]: must be a non-empty"),
        ('agent = "a"\nservers = ["notes"]\nprompts = "greet"', "grants[0].prompts: expected an array"),
        ('agent = "a"\nservers = ["notes"]\nresources = []', "grants[0].tools: missing key"),
    ],
)
def test_malformed_resource_or_prompt_patterns_are_refused(tmp_path: Path, grant: str, expected: str) -> None:
    """A resource or prompt pattern that cannot match is refused with its key path."""
    assert expected in load_error(tmp_path, "[[grants]]\n" + grant + "\n")
