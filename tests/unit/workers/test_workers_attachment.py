"""Namespace attachment (DESIGN §2 step 5, §6): connected and attached are separate facts; typed conditions.

The pure model (:func:`check_attachment`) first, then the per-gateway tracker
fed with events, then ownership records written from its changes.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from workers_support import LEASE_S, T0

from bastion.errors import (
    AttachmentContradictory,
    AttachmentUnproven,
    CallRefused,
    NamespaceNotAttached,
    NamespaceNotConnected,
    StaleEpoch,
)
from bastion.ids import Epoch, WorkerId
from bastion.store.sqlite import SqliteStore
from bastion.workers.attachment import (
    AttachmentEvidence,
    AttachmentTracker,
    Fact,
    NamespaceRequirement,
    NamespaceRequirements,
    Observation,
    Source,
    check_attachment,
    condition_of,
    persist_surface_change,
    transport_session_ref,
)

pytestmark = pytest.mark.anyio

DOWN = AttachmentEvidence("notes", connected=False, attached=None)
NEVER_SEEN = AttachmentEvidence("notes", connected=None, attached=None)
MISSING = AttachmentEvidence("notes", connected=True, attached=False)
NEVER_LISTED = AttachmentEvidence("notes", connected=True, attached=None)
ATTACHED = AttachmentEvidence("notes", connected=True, attached=True)
ATTACHED_NOT_CONNECTED = AttachmentEvidence("notes", connected=False, attached=True)
SOURCES_DISAGREE = AttachmentEvidence.observed(
    "notes",
    [
        Observation(Source.UPSTREAM_EVENTS, Fact.CONNECTED, True),
        Observation(Source.UPSTREAM_HEALTH, Fact.CONNECTED, False),
        Observation(Source.SESSION_SURFACE, Fact.ATTACHED, True),
    ],
)

CASES = [
    pytest.param(DOWN, NamespaceNotConnected, "required_namespace_not_connected", id="not-connected"),
    pytest.param(NEVER_SEEN, NamespaceNotConnected, "required_namespace_not_connected", id="never-seen"),
    pytest.param(MISSING, NamespaceNotAttached, "connected_namespace_missing", id="connected-missing"),
    pytest.param(NEVER_LISTED, NamespaceNotAttached, "connected_namespace_missing", id="never-listed"),
    pytest.param(
        ATTACHED_NOT_CONNECTED, NamespaceNotConnected, "required_namespace_not_connected", id="attached-down"
    ),
    pytest.param(
        SOURCES_DISAGREE, AttachmentContradictory, "attachment_contradictory", id="sources-disagree"
    ),
]


@pytest.mark.parametrize(("evidence", "error", "reason"), CASES)
def test_each_condition_refuses_a_mutating_call_with_its_own_reason(
    evidence: AttachmentEvidence, error: type[AttachmentUnproven], reason: str
) -> None:
    """Every condition is its own typed CallRefused with its stable reason, naming the namespace."""
    with pytest.raises(error) as caught:
        check_attachment({"notes"}, {"notes": evidence}, tool_read_only=False)
    assert type(caught.value) is error and isinstance(caught.value, CallRefused)
    assert caught.value.error_data()["reason"] == reason
    assert caught.value.data["namespaces"] == ["notes"]
    assert caught.value.data["namespace_conditions"]["notes"]["condition"] == reason
    assert condition_of(evidence) is error


@pytest.mark.parametrize(("evidence", "error", "reason"), CASES)
def test_read_only_calls_pass_every_condition(
    evidence: AttachmentEvidence, error: type[AttachmentUnproven], reason: str
) -> None:
    """A tool annotated readOnlyHint is never gated, whatever the evidence says."""
    check_attachment({"notes"}, {"notes": evidence}, tool_read_only=True)


def test_attached_and_connected_passes_and_unrequired_namespaces_do_not_gate() -> None:
    """Proof for every required namespace passes; evidence of namespaces not required is not consulted."""
    check_attachment({"notes"}, {"notes": ATTACHED, "tools": DOWN}, tool_read_only=False)
    check_attachment(set(), {"tools": DOWN}, tool_read_only=False)


def test_absent_evidence_is_unproven_not_healthy() -> None:
    """A required namespace with no evidence at all is refused as not connected, with 'unproven' facts."""
    with pytest.raises(NamespaceNotConnected) as caught:
        check_attachment({"notes"}, {}, tool_read_only=False)
    assert caught.value.data["namespace_conditions"]["notes"] == {
        "condition": "required_namespace_not_connected",
        "connected": "unproven",
        "attached": "unproven",
    }


def test_the_worst_condition_is_raised_and_every_condition_is_listed() -> None:
    """Contradictory outranks not connected, which outranks missing; none hides another in the data."""
    evidence = {
        "a": AttachmentEvidence("a", connected=True, attached=False),
        "b": AttachmentEvidence("b", connected=False, attached=None),
        "c": SOURCES_DISAGREE,
        "d": ATTACHED,
        "e": AttachmentEvidence("e", connected=False, attached=True),
    }
    with pytest.raises(AttachmentContradictory) as caught:
        check_attachment({"a", "b", "c", "d", "e"}, evidence, tool_read_only=False)
    assert caught.value.data["namespaces"] == ["c"]
    assert {ns: c["condition"] for ns, c in caught.value.data["namespace_conditions"].items()} == {
        "a": "connected_namespace_missing",
        "b": "required_namespace_not_connected",
        "c": "attachment_contradictory",
        "e": "required_namespace_not_connected",
    }
    with pytest.raises(NamespaceNotConnected):
        check_attachment({"a", "b"}, evidence, tool_read_only=False)


def test_contradictions_name_what_disagrees() -> None:
    """Evidence explains its contradictions (disagreeing sources); attached but down is an outage, not one."""
    assert SOURCES_DISAGREE.connected is None and SOURCES_DISAGREE.attached is True
    assert SOURCES_DISAGREE.contradictions() == ("sources disagree on connected",)
    assert ATTACHED_NOT_CONNECTED.contradictions() == ()
    assert condition_of(ATTACHED_NOT_CONNECTED) is NamespaceNotConnected
    forged = AttachmentEvidence(
        "notes", True, True, (Observation(Source.SESSION_SURFACE, Fact.ATTACHED, False),)
    )
    assert forged.contradictions() == ("attached disagrees with its source",)
    assert ATTACHED.contradictions() == () and condition_of(ATTACHED) is None


# ---------------------------------------------------------------- requirements


def test_requirements_are_the_union_of_rules_naming_the_agent_or_its_team() -> None:
    """A caller's required namespaces come from rules for its agent and for its team."""
    requirements = NamespaceRequirements(
        (
            NamespaceRequirement(frozenset({"notes"}), agent="alice"),
            NamespaceRequirement(frozenset({"tools", "notes"}), team="ops"),
            NamespaceRequirement(frozenset({"billing"}), agent="bob"),
        )
    )
    assert requirements.required_for("alice", "ops") == {"notes", "tools"}
    assert requirements.required_for("alice", None) == {"notes"}
    assert requirements.required_for("carol", None) == frozenset()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"namespaces": frozenset({"x"})},
        {"namespaces": frozenset({"x"}), "agent": "a", "team": "t"},
        {"namespaces": frozenset(), "agent": "a"},
        {"namespaces": frozenset({""}), "team": "t"},
    ],
    ids=["neither", "both", "no-namespaces", "empty-namespace"],
)
def test_a_requirement_names_one_subject_and_real_namespaces(kwargs: dict[str, object]) -> None:
    """Validated when built: exactly one of agent or team, at least one non-empty namespace."""
    with pytest.raises(ValueError):
        NamespaceRequirement(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the tracker


REF = transport_session_ref("mcp-session-id-of-alice")


def test_required_namespace_down_refuses_mutating_calls_only() -> None:
    """Upstream down: a mutating call is refused not-connected; a read-only call still passes."""
    tracker = AttachmentTracker()
    tracker.upstream_disconnected("notes")
    tracker.surface_listed(REF, ["tools"])
    with pytest.raises(NamespaceNotConnected):
        tracker.check(REF, {"notes"}, tool_read_only=False)
    tracker.check(REF, {"notes"}, tool_read_only=True)


async def test_connected_but_missing_from_the_surface_is_its_own_condition_and_reattach_clears_it() -> None:
    """Connected, absent from this session's surface: connected_namespace_missing until re-attached."""
    calls: list[tuple[str, str]] = []

    async def reattach_session(ref: str, namespace: str) -> Iterable[str]:
        calls.append((ref, namespace))
        return ["notes", "tools"]

    tracker = AttachmentTracker(reattach_session=reattach_session)
    tracker.upstream_connected("notes")
    tracker.upstream_connected("tools")
    tracker.surface_listed(REF, ["tools"])
    with pytest.raises(NamespaceNotAttached):
        tracker.check(REF, {"notes"}, tool_read_only=False)

    evidence = await tracker.reattach(REF, "notes")

    assert calls == [(REF, "notes")]
    assert (evidence.connected, evidence.attached) == (True, True)
    tracker.check(REF, {"notes", "tools"}, tool_read_only=False)


async def test_reattach_without_a_sanctioned_path_changes_nothing() -> None:
    """With no re-attach callback there is nothing to call (and nothing is ever killed)."""
    tracker = AttachmentTracker()
    with pytest.raises(RuntimeError):
        await tracker.reattach(REF, "notes")


async def test_a_failing_reattach_leaves_the_gate_closed() -> None:
    """If re-initializing fails, the surface stays as it was and the call stays refused."""

    async def reattach_session(ref: str, namespace: str) -> Iterable[str]:
        raise ConnectionError("upstream refused the new session")

    tracker = AttachmentTracker(reattach_session=reattach_session)
    tracker.upstream_connected("notes")
    tracker.surface_listed(REF, [])
    with pytest.raises(ConnectionError):
        await tracker.reattach(REF, "notes")
    with pytest.raises(NamespaceNotAttached):
        tracker.check(REF, {"notes"}, tool_read_only=False)


def test_an_outage_after_attachment_is_not_connected_and_health_disagreement_is_contradictory() -> None:
    """Attached then down is an outage (not connected); an event the health probe denies contradicts."""
    health: dict[str, bool | None] = {"notes": True}
    tracker = AttachmentTracker(health_probe=health.get)
    tracker.upstream_connected("notes")
    tracker.surface_listed(REF, ["notes"])
    tracker.check(REF, {"notes"}, tool_read_only=False)
    health["notes"] = False  # the upstream says down; the last event said up
    with pytest.raises(AttachmentContradictory):
        tracker.check(REF, {"notes"}, tool_read_only=False)
    health["notes"] = None
    tracker.upstream_disconnected("notes")
    with pytest.raises(NamespaceNotConnected):
        tracker.check(REF, {"notes"}, tool_read_only=False)


def test_sessions_are_kept_apart_and_closing_one_detaches_only_it() -> None:
    """One session's surface never proves another's; a closed session's attachments all detach."""
    other = transport_session_ref("mcp-session-id-of-bob")
    tracker = AttachmentTracker()
    tracker.upstream_connected("notes")
    first = tracker.surface_listed(REF, ["notes"], at=T0)
    assert (first.attached, first.detached) == ({"notes"}, frozenset())
    with pytest.raises(NamespaceNotAttached):
        tracker.check(other, {"notes"}, tool_read_only=False)
    second = tracker.surface_listed(REF, [])
    assert (second.attached, second.detached) == (frozenset(), {"notes"})
    tracker.surface_listed(REF, ["notes"])
    closed = tracker.session_closed(REF)
    assert closed.detached == {"notes"} and tracker.sessions() == []
    with pytest.raises(NamespaceNotAttached):
        tracker.check(REF, {"notes"}, tool_read_only=False)


def test_describe_shows_each_fact_and_unproven_where_nothing_was_seen() -> None:
    """The admin view: per namespace, connected and attached (or 'unproven') and the condition."""
    tracker = AttachmentTracker()
    assert tracker.describe(REF) is None
    tracker.upstream_connected("tools")
    tracker.surface_listed(REF, ["tools"], at=T0)
    described = tracker.describe(REF, ["notes"])
    assert described is not None and described["surface_listed_at"] == T0.isoformat()
    by_namespace = {n["namespace"]: n for n in described["namespaces"]}
    assert by_namespace["notes"]["connected"] == "unproven"
    assert by_namespace["notes"]["condition"] == "required_namespace_not_connected"
    assert (by_namespace["tools"]["connected"], by_namespace["tools"]["attached"]) == (True, True)
    assert by_namespace["tools"]["condition"] is None


def test_two_trackers_share_nothing() -> None:
    """No process-global state: two gateways' trackers are independent."""
    one, two = AttachmentTracker(), AttachmentTracker()
    one.upstream_connected("notes")
    one.surface_listed(REF, ["notes"])
    one.check(REF, {"notes"}, tool_read_only=False)
    with pytest.raises(NamespaceNotConnected):
        two.check(REF, {"notes"}, tool_read_only=False)


def test_the_session_reference_is_stable_and_does_not_reveal_the_session_id() -> None:
    """Derived one-way from the Mcp-Session-Id: records and the admin API never hold the id itself."""
    assert transport_session_ref("abc") == transport_session_ref("abc") != transport_session_ref("abd")
    assert "abc" not in transport_session_ref("abc") and transport_session_ref("abc").startswith("ts_")


# ---------------------------------------------------------------- ownership records


async def test_surface_changes_become_fenced_ownership_records(store: SqliteStore) -> None:
    """Attached namespaces are recorded, detached ones cleared, under the writer's epoch; stale: nothing."""
    writer = WorkerId("gateway-20260501T120000Z-0123456789ab")
    runtime = WorkerId("upstream-notes-20260501T120000Z-0123456789ab")
    for worker in (writer, runtime):
        await store.register_worker(worker, "gateway", {"pid": 1, "host": "h", "started_by": "t"}, now=T0)
    epoch = await store.claim_generation("g1", writer, now=T0, lease_s=LEASE_S)
    tracker = AttachmentTracker()
    owners = {"notes": runtime, "tools": writer}

    change = tracker.surface_listed(REF, ["notes", "tools", "unowned"])
    await persist_surface_change(store, change, worker_for=owners.get, writer=writer, epoch=epoch, now=T0)
    assert sorted(
        (r.namespace, r.worker_id) for r in await store.list_attachments(transport_session_ref=REF)
    ) == [
        ("notes", runtime),
        ("tools", writer),
    ]
    change = tracker.surface_listed(REF, ["tools"])
    await persist_surface_change(store, change, worker_for=owners.get, writer=writer, epoch=epoch, now=T0)
    assert [r.namespace for r in await store.list_attachments(transport_session_ref=REF)] == ["tools"]
    with pytest.raises(StaleEpoch):
        await persist_surface_change(
            store,
            tracker.session_closed(REF),
            worker_for=owners.get,
            writer=writer,
            epoch=Epoch(epoch + 1),
            now=T0,
        )
    assert [r.namespace for r in await store.list_attachments(transport_session_ref=REF)] == ["tools"]
