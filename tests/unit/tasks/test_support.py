"""tasks/support.py: which results are tasks, which tools cannot run as plain calls (issue 24)."""

from __future__ import annotations

import pytest

from bastion.errors import TaskRequired
from bastion.tasks.support import check_runs_without_task, is_task_result

_TASK = {"taskId": "t-1", "status": "working", "createdAt": "now", "lastUpdatedAt": "now"}


def test_both_revisions_task_results_are_recognised() -> None:
    """A 2025-11-25 CreateTaskResult (task object, no content) and a 2026 one (resultType task) are tasks."""
    assert is_task_result({"task": _TASK})
    assert is_task_result({"resultType": "task", **_TASK})


def test_a_tool_result_is_not_a_task_even_with_a_task_key() -> None:
    """A tool result with content stays a tool result, whatever else it carries."""
    assert not is_task_result({"content": [], "task": _TASK})
    assert not is_task_result({"content": [], "resultType": "complete"})
    assert not is_task_result({"resultType": "input_required", "inputRequests": {}})


@pytest.mark.parametrize("support", [None, "forbidden", "optional"])
def test_a_tool_that_may_run_plainly_passes(support: str | None) -> None:
    """Absent, forbidden and optional task support all run as a plain call."""
    definition = {"name": "t"} if support is None else {"name": "t", "execution": {"taskSupport": support}}
    check_runs_without_task(definition, "ns__t")


def test_a_task_only_tool_is_refused_by_name() -> None:
    """taskSupport required raises TaskRequired naming the tool."""
    with pytest.raises(TaskRequired) as refused:
        check_runs_without_task({"execution": {"taskSupport": "required"}}, "ns__t")
    assert refused.value.data["tool"] == "ns__t"
    assert refused.value.jsonrpc_code == -32080
