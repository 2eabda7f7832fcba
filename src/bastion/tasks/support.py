"""Whether a tool call can cross the gateway without a task, and what a plain call refuses (issue 24).

The 2025-11-25 revision augments a ``tools/call`` with ``params.task``. Where ``relay.py`` relays
tasks (a session-era client, a tool and a server that take one) the augmentation goes upstream;
everywhere else it stops here, as the spec asks of a receiver that does not declare tasks, and
the upstream is sent a plain call: a task the gateway did not record cannot be owned, audited or
refused to another agent. The 2026 tasks extension is not relayed.

A tool whose ``execution.taskSupport`` is ``"required"`` cannot run as a plain call: the call is
refused with :class:`~bastion.errors.TaskRequired`, before admission and before any upstream is
asked, never sent to fail upstream. An upstream that answers a plain call with a task anyway
(either revision's ``CreateTaskResult``) has started work nobody can collect through the gateway:
the result is not relayed (``settle.py``: ``UpstreamProtocolError``, problem ``unrequested_task``)
and the execution is ``outcome_unknown``, so a replay is refused and no second task is created.
Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from bastion.errors import TaskRequired

__all__ = ["TASK_PARAM", "check_runs_without_task", "is_task_result"]

# The 2025-11-25 task augmentation of a request (``TaskMetadata``: ``ttl``).
TASK_PARAM: Final[str] = "task"


def check_runs_without_task(definition: Mapping[str, Any], tool: str) -> None:
    """``None`` when the upstream tool runs as a plain call.

    Raises:
        TaskRequired: its ``execution.taskSupport`` is ``"required"``.
    """
    execution = definition.get("execution")
    if isinstance(execution, Mapping) and execution.get("taskSupport") == "required":
        raise TaskRequired(
            f"Tool {tool} runs only as a task, and this call cannot be relayed as one",
            tool=tool,
        )


def is_task_result(result: Mapping[str, Any]) -> bool:
    """Whether ``result`` is a ``CreateTaskResult``: 2026 (``resultType: "task"``, the task's fields
    flat) or 2025-11-25 (a ``task`` object where a tool result would be)."""
    if result.get("resultType") == "task":
        return True
    return isinstance(result.get("task"), Mapping) and "content" not in result
