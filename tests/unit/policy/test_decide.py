"""Tests for policy/decide.py: deny by default, subjects, globs, constraints, rate limits, tools/list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from bastion.auth.principal import Principal
from bastion.errors import ArgumentConstraintFailed, GrantDenied, RateLimited
from bastion.ids import AgentId
from bastion.policy.decide import DecisionBasis, GrantDecision, RateLimiter, decide, visible_tools
from bastion.policy.grants import Grant, Rate, Subject, SubjectKind
from bastion.policy.snapshot import GatewaySettings, ServerSpec, Snapshot, UpstreamKind

DEMO = Principal(agent=AgentId("demo"))


def snapshot(*grants: Grant, version: str = "v1") -> Snapshot:
    return Snapshot(
        version=version,
        gateway=GatewaySettings(),
        servers={
            "notes": ServerSpec(name="notes", namespace="memo", kind=UpstreamKind.STDIO, command="python"),
            "tools": ServerSpec(name="tools", namespace="tools", kind=UpstreamKind.HTTP, url="http://x/mcp"),
        },
        agents=(),
        grants=grants,
    )


def grant(
    name: str = "g",
    *,
    subject: Subject | None = None,
    tools: tuple[str, ...] = ("*",),
    servers: frozenset[str] = frozenset({"notes"}),
    namespaces: frozenset[str] = frozenset(),
    schema: dict[str, Any] | None = None,
    require_execution_id: bool = False,
    rate: Rate | None = None,
) -> Grant:
    return Grant(
        name=name,
        subject=subject or Subject(SubjectKind.AGENT, "demo"),
        tools=tools,
        servers=servers,
        namespaces=namespaces,
        arguments_schema=schema,
        require_execution_id=require_execution_id,
        rate=rate,
    )


def call(
    snap: Snapshot,
    tool: str,
    arguments: dict[str, Any] | None = None,
    *,
    principal: Principal = DEMO,
    server: str = "notes",
    now: float = 0.0,
    limiter: RateLimiter | None = None,
) -> GrantDecision:
    namespace = snap.servers[server].namespace
    return decide(
        snap,
        principal,
        server,
        namespace,
        tool,
        arguments or {},
        now=now,
        limiter=limiter if limiter is not None else RateLimiter(),
    )


def test_no_grants_declared_allows_every_call() -> None:
    """Without [[grants]] every authenticated agent may call every tool, and the decision says why."""
    decision = call(snapshot(), "anything", principal=Principal(agent=AgentId("stranger")))
    assert decision == GrantDecision(DecisionBasis.NO_GRANTS_DECLARED, (), False, "v1")
    assert decision.grant is None


def test_allowed_call_names_grant_and_version() -> None:
    """A covered call is allowed and the decision names the grant and the snapshot version."""
    decision = call(snapshot(grant("writers", tools=("write_note",)), version="abc"), "write_note")
    assert decision.basis is DecisionBasis.GRANT
    assert decision.grant == "writers"
    assert decision.policy_version == "abc"
    assert decision.require_execution_id is False


def test_denied_by_tool() -> None:
    """Once grants exist, a tool no grant names is refused with grant_denied and the version."""
    snap = snapshot(grant(tools=("read_note",)), version="v7")
    with pytest.raises(GrantDenied) as excinfo:
        call(snap, "delete_note")
    assert excinfo.value.error_data() == {
        "reason": "grant_denied",
        "tool": "delete_note",
        "server": "notes",
        "policy_version": "v7",
    }


def test_denied_on_a_server_the_grant_does_not_name() -> None:
    """A grant for one server does not cover a same-named tool on another."""
    with pytest.raises(GrantDenied):
        call(snapshot(grant(servers=frozenset({"notes"}))), "add", server="tools")


def test_namespace_grant_covers_its_server() -> None:
    """A grant by namespace covers the server that carries that namespace."""
    snap = snapshot(grant(servers=frozenset(), namespaces=frozenset({"memo"})))
    assert call(snap, "read_note").grant == "g"
    with pytest.raises(GrantDenied):
        call(snap, "add", server="tools")


def test_other_agent_is_denied() -> None:
    """A grant for agent demo does not cover agent other."""
    with pytest.raises(GrantDenied):
        call(snapshot(grant()), "read_note", principal=Principal(agent=AgentId("other")))


@pytest.mark.parametrize(
    ("pattern", "tool", "covered"),
    [
        ("read_*", "read_note", True),
        ("read_*", "write_note", False),
        ("*_note", "read_note", True),
        ("note?", "note1", True),
        ("note?", "note12", False),
        ("note[12]", "note2", True),
        ("note[!12]", "note2", False),
        ("Read_*", "read_note", False),  # case-sensitive on every platform
        ("read_note", "read_notes", False),  # exact names are exact
    ],
)
def test_glob_matching(pattern: str, tool: str, covered: bool) -> None:
    """Tool patterns are fnmatch globs over the upstream tool name, case-sensitive."""
    snap = snapshot(grant(tools=(pattern,)))
    if covered:
        assert call(snap, tool).grant == "g"
    else:
        with pytest.raises(GrantDenied):
            call(snap, tool)


@pytest.mark.parametrize(
    ("subject", "allowed", "denied"),
    [
        (
            Subject(SubjectKind.AGENT, "*"),
            Principal(agent=AgentId("anyone")),
            None,
        ),
        (
            Subject(SubjectKind.TEAM, "ops"),
            Principal(agent=AgentId("a"), team="ops"),
            Principal(agent=AgentId("ops")),  # an agent named like the team is not in it
        ),
        (
            Subject(SubjectKind.HUMAN, "alice"),
            Principal(agent=AgentId("a"), human="alice"),
            Principal(agent=AgentId("a"), human="bob"),
        ),
        (
            Subject(SubjectKind.SCOPE, "notes:write"),
            Principal(agent=AgentId("a"), scopes=frozenset({"notes:read", "notes:write"})),
            Principal(agent=AgentId("a"), scopes=frozenset({"notes:read"})),
        ),
    ],
)
def test_subject_kinds(subject: Subject, allowed: Principal, denied: Principal | None) -> None:
    """Agent, team, human and scope subjects each match only their own attribute of the principal."""
    snap = snapshot(grant(subject=subject))
    assert call(snap, "read_note", principal=allowed).grant == "g"
    if denied is not None:
        with pytest.raises(GrantDenied):
            call(snap, "read_note", principal=denied)


def test_principal_without_team_matches_no_team_grant() -> None:
    """A principal with no team, human or scopes matches no team, human or scope grant."""
    snap = snapshot(
        grant("t", subject=Subject(SubjectKind.TEAM, "ops")),
        grant("h", subject=Subject(SubjectKind.HUMAN, "alice")),
        grant("s", subject=Subject(SubjectKind.SCOPE, "x")),
    )
    with pytest.raises(GrantDenied):
        call(snap, "read_note", principal=Principal(agent=AgentId("demo")))


SCHEMA = {
    "type": "object",
    "required": ["title"],
    "properties": {"title": {"type": "string", "maxLength": 5}},
    "additionalProperties": False,
}


def test_denied_by_argument_constraint_without_echoing_values() -> None:
    """Arguments that break the schema are refused with the schema path, never the value."""
    snap = snapshot(grant("w", schema=SCHEMA), version="v2")
    assert call(snap, "write_note", {"title": "short"}).grant == "w"
    with pytest.raises(ArgumentConstraintFailed) as excinfo:
        call(snap, "write_note", {"title": "secret-and-too-long"})
    data = excinfo.value.error_data()
    assert data["reason"] == "argument_constraint_failed"
    assert data["grant"] == "w" and data["policy_version"] == "v2"
    assert data["schema_path"] == "properties/title/maxLength"
    assert "secret" not in str(excinfo.value) and "secret" not in str(data)
    with pytest.raises(ArgumentConstraintFailed):
        call(snap, "write_note", {"title": "ok", "extra": 1})


def test_format_is_asserted() -> None:
    """`format` is checked (not only annotated): a constraint may require an email."""
    snap = snapshot(grant(schema={"properties": {"to": {"type": "string", "format": "email"}}}))
    assert call(snap, "send", {"to": "a@example.com"}).grant == "g"
    with pytest.raises(ArgumentConstraintFailed):
        call(snap, "send", {"to": "not-an-email"})


def test_unresolvable_ref_fails_closed() -> None:
    """A schema that cannot be evaluated (a $ref to nowhere) refuses the call."""
    snap = snapshot(grant(schema={"$ref": "https://example.invalid/schema.json"}))
    with pytest.raises(ArgumentConstraintFailed) as excinfo:
        call(snap, "write_note", {})
    assert "could not be evaluated" in excinfo.value.data["schema_path"]


def test_another_grant_without_constraint_allows() -> None:
    """Grants add up: a constrained grant does not take away what another grant allows."""
    snap = snapshot(grant("narrow", schema=SCHEMA), grant("broad", tools=("write_note",)))
    assert call(snap, "write_note", {"title": "much too long"}).grants == ("broad",)
    assert call(snap, "write_note", {"title": "ok"}).grants == ("narrow", "broad")


def test_execution_id_requirement_of_any_allowing_grant_holds() -> None:
    """A broader grant does not lift a narrower grant's execution_id requirement."""
    snap = snapshot(grant("broad"), grant("strict", tools=("delete_*",), require_execution_id=True))
    assert call(snap, "delete_note").require_execution_id is True
    assert call(snap, "read_note").require_execution_id is False


def test_rate_limit_with_injected_clock() -> None:
    """A token bucket per agent and tool: N calls, then rate_limited until it refills."""
    limiter = RateLimiter()
    snap = snapshot(grant(rate=Rate(tokens=2, period_s=60.0)))
    call(snap, "read_note", now=0.0, limiter=limiter)
    call(snap, "read_note", now=1.0, limiter=limiter)
    with pytest.raises(RateLimited) as excinfo:
        call(snap, "read_note", now=2.0, limiter=limiter)
    data = excinfo.value.error_data()
    assert data["reason"] == "rate_limited" and data["policy_version"] == "v1"
    assert data["retry_after_s"] == pytest.approx(28.0)  # 1 token per 30 s; 2 s of refill so far
    # Another tool and another agent have their own buckets.
    call(snap, "write_note", now=2.0, limiter=limiter)
    other = Principal(agent=AgentId("other"))
    star = snapshot(grant(subject=Subject(SubjectKind.AGENT, "*"), rate=Rate(tokens=2, period_s=60.0)))
    call(star, "read_note", principal=other, now=2.0, limiter=limiter)
    # Refilled after 30 s: one more call, then refused again.
    call(snap, "read_note", now=30.0, limiter=limiter)
    with pytest.raises(RateLimited):
        call(snap, "read_note", now=30.5, limiter=limiter)


def test_rate_limits_of_all_allowing_grants_apply_and_refusal_takes_nothing() -> None:
    """Every allowing grant's bucket must have a token; a refused call consumes none."""
    limiter = RateLimiter()
    snap = snapshot(
        grant("daily", rate=Rate(tokens=3, period_s=86400.0)),
        grant("burst", tools=("read_*",), rate=Rate(tokens=1, period_s=1.0)),
    )
    call(snap, "read_note", limiter=limiter, now=0.0)
    for _ in range(5):
        with pytest.raises(RateLimited) as excinfo:
            call(snap, "read_note", limiter=limiter, now=0.5)
        assert excinfo.value.data["grant"] == "burst"
    # The five refusals took nothing from "daily": two more calls pass, then "daily" refuses.
    call(snap, "read_note", limiter=limiter, now=1.0)
    call(snap, "read_note", limiter=limiter, now=2.0)
    with pytest.raises(RateLimited) as excinfo:
        call(snap, "read_note", limiter=limiter, now=3.0)
    assert excinfo.value.data["grant"] == "daily"


def test_rate_buckets_survive_a_reload_that_keeps_the_rate() -> None:
    """Same grant name and rate in a new snapshot: the same bucket; a new rate: a new bucket."""
    limiter = RateLimiter()
    call(snapshot(grant(rate=Rate(1, 60.0)), version="a"), "read_note", limiter=limiter)
    with pytest.raises(RateLimited):
        call(snapshot(grant(rate=Rate(1, 60.0)), version="b"), "read_note", limiter=limiter)
    call(snapshot(grant(rate=Rate(2, 60.0)), version="c"), "read_note", limiter=limiter)


def test_limiter_refuses_rather_than_forgets_live_buckets() -> None:
    """A full limiter drops only refilled buckets; with none to drop, new callers are refused."""
    limiter = RateLimiter(max_buckets=2)
    snap = snapshot(grant(rate=Rate(1, 60.0)))
    call(snap, "a", limiter=limiter, now=0.0)
    call(snap, "b", limiter=limiter, now=0.0)
    with pytest.raises(RateLimited) as excinfo:
        call(snap, "c", limiter=limiter, now=1.0)
    assert excinfo.value.cause == "limiter_full"
    call(snap, "c", limiter=limiter, now=61.0)  # a and b have refilled: forgotten
    assert limiter.bucket_count == 1


def test_clock_stepping_back_refills_nothing() -> None:
    """A clock that goes backwards never creates tokens."""
    limiter = RateLimiter()
    snap = snapshot(grant(rate=Rate(1, 60.0)))
    call(snap, "read_note", now=100.0, limiter=limiter)
    with pytest.raises(RateLimited):
        call(snap, "read_note", now=50.0, limiter=limiter)
    # A bucket used while the clock was behind does not count the same time twice.
    two = snapshot(grant("two", rate=Rate(2, 60.0)))
    call(two, "read_note", now=100.0, limiter=limiter)
    call(two, "read_note", now=40.0, limiter=limiter)  # second token, clock stepped back
    with pytest.raises(RateLimited):
        call(two, "read_note", now=100.0, limiter=limiter)


@dataclass(frozen=True)
class Entry:
    exposed_name: str
    server: str
    namespace: str
    upstream_name: str


CATALOG = [
    Entry("memo__read_note", "notes", "memo", "read_note"),
    Entry("memo__write_note", "notes", "memo", "write_note"),
    Entry("tools__add", "tools", "tools", "add"),
]


def test_tools_list_filtering() -> None:
    """tools/list shows exactly the tools some grant of the principal covers, in catalog order."""
    snap = snapshot(
        grant("r", tools=("read_*",)),
        grant("w", tools=("write_note",), schema=SCHEMA),  # constrained tools stay visible
        grant("ops", subject=Subject(SubjectKind.TEAM, "ops"), servers=frozenset({"tools"})),
    )
    assert [e.exposed_name for e in visible_tools(snap, DEMO, CATALOG)] == [
        "memo__read_note",
        "memo__write_note",
    ]
    ops = Principal(agent=AgentId("x"), team="ops")
    assert [e.exposed_name for e in visible_tools(snap, ops, CATALOG)] == ["tools__add"]
    assert visible_tools(snap, Principal(agent=AgentId("nobody")), CATALOG) == []


def test_tools_list_without_grants_shows_everything() -> None:
    """In the no-grants-declared mode every tool is visible."""
    assert visible_tools(snapshot(), DEMO, CATALOG) == CATALOG
