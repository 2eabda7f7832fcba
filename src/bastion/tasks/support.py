"""Whether a tool call can cross the gateway without a task, and what a plain call refuses (issue 24).

The 2025-11-25 revision augments a ``tools/call`` with ``params.task``. Where ``relay.py`` relays
tasks (a session-era client, a tool and a server that take one) the augmentation goes upstream;
everywhere else it stops here, as the spec asks of a receiver that does not declare tasks, and
the upstream is sent a plain call: a task the gateway did not record cannot be owned, audited or
refused to another agent.

The 2026 tasks extension (SEP-2663, ``io.modelcontextprotocol/tasks``) has no augmentation: the
server decides, for a request that negotiated the extension (in its ``_meta`` client capabilities,
or a session's ``initialize``). The gateway negotiates it upstream per request, and only where it
relays the task (:data:`TASKS_EXTENSION`, :func:`asks_extension`, :func:`declares_extension`).

A tool whose ``execution.taskSupport`` is ``"required"`` cannot run as a plain call: the call is
refused with :class:`~bastion.errors.TaskRequired` (or, where its server speaks the extension,
:class:`~bastion.errors.TaskExtensionRequired`: -32021 naming it), before admission and before any upstream is
asked, never sent to fail upstream. An upstream that answers a plain call with a task anyway
(either revision's ``CreateTaskResult``) has started work nobody can collect through the gateway:
the result is not relayed (``settle.py``: ``UpstreamProtocolError``, problem ``unrequested_task``)
and the execution is ``outcome_unknown``, so a replay is refused and no second task is created.
Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcp.shared.inbound import decode_header_value

from bastion.errors import TaskExtensionRequired, TaskRequired
from bastion.versions import CAPABILITIES_META_KEY

__all__ = [
    "TASKS_EXTENSION",
    "TASK_PARAM",
    "asks_extension",
    "check_runs_without_task",
    "declares_extension",
    "extension_opt_in",
    "is_task_result",
    "task_name_mismatch",
    "task_support",
]

# The 2025-11-25 task augmentation of a request (``TaskMetadata``: ``ttl``).
TASK_PARAM: Final[str] = "task"
# The 2026 tasks extension (SEP-2663).
TASKS_EXTENSION: Final[str] = "io.modelcontextprotocol/tasks"
# Its methods that name a task: Streamable HTTP mirrors params.taskId as the Mcp-Name header.
TASK_NAMED_METHODS: Final[frozenset[str]] = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})


def task_support(definition: Mapping[str, Any]) -> str | None:
    """A tool's ``execution.taskSupport`` (``"optional"``, ``"required"``, ...), or ``None``."""
    execution = definition.get("execution")
    support = execution.get("taskSupport") if isinstance(execution, Mapping) else None
    return support if isinstance(support, str) else None


def check_runs_without_task(definition: Mapping[str, Any], tool: str, *, extension: bool = False) -> None:
    """``None`` when the upstream tool runs as a plain call.

    Raises:
        TaskExtensionRequired: it is ``"required"`` and its server speaks the tasks extension
            (``extension``): the client did not negotiate it (-32021, as the server would say).
        TaskRequired: its ``execution.taskSupport`` is ``"required"``.
    """
    if task_support(definition) != "required":
        return
    message = f"Tool {tool} runs only as a task, and this call cannot be relayed as one"
    if extension:
        raise TaskExtensionRequired(
            message, tool=tool, requiredCapabilities={"extensions": {TASKS_EXTENSION: {}}}
        )
    raise TaskRequired(message, tool=tool)


def asks_extension(client_capabilities: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """Whether this request negotiated the tasks extension: its ``_meta`` client capabilities
    (the sessionless era's, or a per-request opt-in), else the session's."""
    meta = params.get("_meta")
    declared = meta.get(CAPABILITIES_META_KEY) if isinstance(meta, Mapping) else None
    for capabilities in (declared, client_capabilities):
        extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
        if isinstance(extensions, Mapping) and isinstance(extensions.get(TASKS_EXTENSION), Mapping):
            return True
    return False


def declares_extension(*declarations: object) -> bool:
    """Whether a server's declared (or discovered) capabilities include the tasks extension."""
    for declared in declarations:
        extensions = declared.get("extensions") if isinstance(declared, Mapping) else None
        if isinstance(extensions, Mapping) and isinstance(extensions.get(TASKS_EXTENSION), Mapping):
            return True
    return False


def extension_opt_in(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` negotiating the tasks extension for itself alone (per-request ``_meta``): what the
    gateway sends upstream for a call or ``tasks/*`` request it relays as the extension's."""
    meta = dict(request.get("_meta") or {})
    meta[CAPABILITIES_META_KEY] = {"extensions": {TASKS_EXTENSION: {}}}
    return {**request, "_meta": meta}


def is_task_result(result: Mapping[str, Any]) -> bool:
    """Whether ``result`` is a ``CreateTaskResult``: 2026 (``resultType: "task"``, the task's fields
    flat) or 2025-11-25 (a ``task`` object where a tool result would be)."""
    if result.get("resultType") == "task":
        return True
    return isinstance(result.get("task"), Mapping) and "content" not in result


def task_name_mismatch(method: object, params: object, header: str | None) -> str | None:
    """Why a sessionless request's ``Mcp-Name`` header does not name the task its body names (the
    extension's routing header, SEP-2663 on SEP-2243's rules: missing or different), or ``None``."""
    if method not in TASK_NAMED_METHODS or not isinstance(params, Mapping):
        return None
    task_id = params.get("taskId")
    if not isinstance(task_id, str):
        return None  # the method's own check refuses the body
    named = decode_header_value(header.strip() if header is not None else None)
    if named == task_id:
        return None
    return "Mcp-Name header does not match the request body's 'taskId' parameter"
