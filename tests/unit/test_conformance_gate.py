"""The conformance gate (tests/conformance/run.py): through passes no fewer checks than direct."""

from __future__ import annotations

from tests.conformance.run import excepted, gate, shortfalls


def test_shortfalls_count_missing_passes_on_gated_scenarios_only() -> None:
    """Where Bastion passes fewer checks is a shortfall, subscriptions too; extra passes are not."""
    direct = {"tools-list": (3, 0), "resources-subscribe": (1, 0), "ping": (1, 0), "tasks-lifecycle": (2, 7)}
    through = {"tools-list": (1, 2), "resources-subscribe": (0, 1), "ping": (1, 0), "tasks-lifecycle": (3, 6)}
    assert shortfalls(direct, through) == {"tools-list": 2, "resources-subscribe": 1}
    # Gated since issue 9's subscriptions were built.
    assert not excepted("resources-subscribe") and not excepted("resources-unsubscribe")
    # Gated since issue 9: resources, prompts and completion pass through as they do directly.
    assert not excepted("resources-list") and not excepted("prompts-get-simple")
    assert not excepted("completion-complete") and not excepted("tools-call-sampling")


def test_a_shortfall_above_the_baseline_fails_and_one_below_asks_to_tighten() -> None:
    """The baseline may only shrink: more missing than recorded fails; fewer is reported as TIGHTEN."""
    baseline = {"run [v]": {"tools-list": 2, "ping": 1}}
    failures, tighten = gate({"run [v]": {"tools-list": 3}}, baseline)
    assert len(failures) == 1 and "tools-list" in failures[0]
    assert tighten == ["TIGHTEN run [v] / ping: baseline allows 1, now 0"]
    assert gate({"run [v]": {"new-scenario": 1}}, {}) == (
        ["run [v] / new-scenario: Bastion passes 1 fewer checks than direct (baseline allows 0)"],
        [],
    )
