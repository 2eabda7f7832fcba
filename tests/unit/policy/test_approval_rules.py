"""A grant's ``approval`` and ``[auth.approvers]`` (issue 27): checked at load, one line per defect."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.auth.bearer import hash_token
from bastion.auth.principal import Principal
from bastion.errors import ConfigError
from bastion.ids import AgentId
from bastion.policy.approval_rules import ApprovalRule
from bastion.policy.decide import decide
from bastion.policy.load import snapshot_from_mapping

CAROL = hash_token("carol-approver-token-" + "c" * 20)


def config(approval: Any = None, approvers: Any = None, **auth: Any) -> dict[str, Any]:
    grant: dict[str, Any] = {"name": "guarded", "agent": "demo", "servers": ["tools"], "tools": ["delete"]}
    if approval is not None:
        grant["approval"] = approval
    return {
        "servers": {"tools": {"url": "http://127.0.0.1:9000/mcp"}},
        "agents": {"demo": {"token_sha256": hash_token("demo-token-" + "d" * 20)}},
        "auth": {"approvers": {"carol": {"token_sha256": CAROL}} if approvers is None else approvers, **auth},
        "grants": [grant, {"name": "open", "agent": "demo", "servers": ["tools"], "tools": ["*"]}],
    }


def load(data: dict[str, Any]) -> Any:
    return snapshot_from_mapping(data, source=None, version="t", environ={})


def test_a_grant_with_approval_reads_its_rule_and_defaults_fail_closed() -> None:
    """approvers named; timeout 300 s and arguments hidden unless set."""
    snapshot = load(config({"approvers": ["carol"]}))
    assert snapshot.grants[0].approval == ApprovalRule(("carol",), 300.0, False)
    assert dict(snapshot.auth.approvers) == {"carol": CAROL}


def test_another_allowing_grant_does_not_lift_the_approval() -> None:
    """The decision carries the approval of the first allowing grant that requires one."""
    snapshot = load(config({"approvers": ["carol"], "timeout_s": 5, "show_arguments": True}))
    decision = decide(
        snapshot, Principal(AgentId("demo")), "tools", "tools", "delete", {}, now=0.0, limiter=None
    )
    assert decision.approval == ("guarded", ApprovalRule(("carol",), 5.0, True))
    other = decide(snapshot, Principal(AgentId("demo")), "tools", "tools", "read", {}, now=0.0, limiter=None)
    assert other.approval is None


@pytest.mark.parametrize(
    ("approval", "message"),
    [
        pytest.param("carol", r"grants\[0\]\.approval: expected a table", id="not-a-table"),
        pytest.param({}, r"grants\[0\]\.approval\.approvers: missing key", id="no-approvers"),
        pytest.param(
            {"approvers": []}, r"grants\[0\]\.approval\.approvers: expected a non-empty", id="empty"
        ),
        pytest.param(
            {"approvers": ["carol"], "who": 1}, r"grants\[0\]\.approval\.who: unknown key", id="unknown"
        ),
        pytest.param(
            {"approvers": ["carol", "carol"]}, r"approval\.approvers: names an approver twice", id="twice"
        ),
        pytest.param(
            {"approvers": ["carol"], "timeout_s": 0}, r"approval\.timeout_s: must be above 0", id="zero"
        ),
        pytest.param(
            {"approvers": ["carol"], "timeout_s": True}, r"approval\.timeout_s: expected", id="bool"
        ),
        pytest.param({"approvers": ["carol"], "timeout_s": 1e9}, r"at most 86400", id="too-long"),
        pytest.param(
            {"approvers": ["carol"], "show_arguments": "yes"}, r"show_arguments: expected", id="show"
        ),
        pytest.param(
            {"approvers": ["zed"]}, r"grant guarded: approval\.approvers\[0\] 'zed' is not declared", id="who"
        ),
    ],
)
def test_a_malformed_approval_is_refused_in_one_line_naming_its_key(approval: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load(config(approval))
    assert "\n" not in caught.value.message


@pytest.mark.parametrize(
    ("approvers", "message"),
    [
        pytest.param(
            {"carol": {}}, r"auth\.approvers\.carol\.token_sha256: missing or malformed", id="no-digest"
        ),
        pytest.param(
            {"carol": {"token_sha256": "x"}}, r"auth\.approvers\.carol\.token_sha256", id="bad-digest"
        ),
        pytest.param(
            {"carol": {"token": "secret"}}, r"auth\.approvers\.carol\.token: unknown key", id="plain-secret"
        ),
        pytest.param(
            {"car ol": {"token_sha256": CAROL}}, r"auth\.approvers\.car ol: an approver name", id="name"
        ),
    ],
)
def test_a_malformed_approver_is_refused_and_never_echoes_a_value(approvers: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load(config({"approvers": ["carol"]}, approvers=approvers))
    assert "secret" not in caught.value.message


def test_an_approver_credential_holds_no_other_role() -> None:
    """An approver token that is also the admin token is refused, naming both key paths."""
    with pytest.raises(ConfigError, match=r"auth\.approvers\.carol\.token_sha256.*auth\.admin_token_sha256"):
        load(config({"approvers": ["carol"]}, admin_token_sha256=CAROL))
