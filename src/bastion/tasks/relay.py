"""Tasks relayed as governed calls: 2025-11-25 ``tasks`` in the session era (issue 24).

A ``tools/call`` that asks for a task (``params.task``) is sent with it only to an upstream that
declares ``tasks.requests.tools.call``, for a tool whose ``execution.taskSupport`` allows one
(:meth:`TaskRelay.relays_task`). The upstream's ``CreateTaskResult`` is not passed through as it
came: :meth:`TaskRelay.created` records the task in the store under its owner (agent and agent
session) and a fresh gateway id (``task_`` + 128 random bits, ``store/task_operations.py``), and
the client sees only that id. The upstream's id never leaves the gateway, so an id is worth
nothing to anyone but its owner: the store is keyed per owner, and another owner's id, a revoked
agent session's, or a made-up one all answer as the same unknown task (-32602, the upstream's own
answer to an unknown id) before any upstream is asked; so does a task whose tool no grant of the
caller covers any more (the store keeps the creating call's upstream tool; a row from before it
did is checked per server).

``tasks/get``, ``tasks/result``, ``tasks/cancel`` go to the server that created the task, on the
caller's own upstream session or process (``call_context.py``), with the upstream's id; the
answer comes back with the gateway's id. ``tasks/list`` lists the owner's tasks from the store
and shows each as its upstream reports it (a task its upstream no longer lists is left out).

Governance: the creating call was admitted under its ``execution_id`` like any call, and the row
stays ``invoking`` while the task lives (a replay is answered with the same task, never a second
creation: ``call.py``), also through a crash of its gateway (recovery leaves it to its live task:
``workers/recovery.py``). The first request that sees the task terminal (any replica, of any
generation: the store's first terminal status wins) moves the execution to its terminal state with
the audit entry that says so, in one write: ``completed`` → ``completed``, ``failed`` → ``failed``,
``cancelled`` → ``outcome_unknown`` (the work may have partly run). A live task the upstream no
longer knows (its process died, its ttl passed) has lost its fate: the task is recorded ``failed``,
the execution ``outcome_unknown``, and the caller is told :class:`~bastion.errors.OutcomeUnknown`.
Creation, each status change, the result and a cancellation are audit entries that carry the
creating call's ``call_id`` and ``execution_id`` (they join with its entries offline), written to
the caller's chain: for the same client session, the creating call's chain.

``notifications/tasks/status`` that a server pushes on a client's own upstream session (its GET
stream) or from its own stdio process reach that client only, under the gateway's id
(:meth:`TaskRelay.status_notified`, found in the store per owner); a status for an id nobody there
owns is dropped with a log line, and a terminal one settles the execution as a poll would. One
pushed before its task is recorded, while a call is in flight, is held on the transport session
and relayed when :meth:`TaskRelay.created` records the task.

Two wires (:class:`TaskWire`). ``AUGMENTED``: the 2025-11-25 revision's (``params.task``, a
``CreateTaskResult`` holding ``task``, ``tasks/result`` and ``tasks/list``), for a session-era
client at a revision that has tasks (``versions.TASKS_VERSIONS``). ``EXTENSION``: the 2026 tasks
extension (SEP-2663, ``io.modelcontextprotocol/tasks``), in either client era, for a request that
negotiated it (its ``_meta`` client capabilities, or its session's) and a server that declares
it. There the server decides: the gateway negotiates the extension upstream for that one request
(``support.extension_opt_in``), never for a session, so an upstream makes tasks only of calls the
gateway records. The ``CreateTaskResult`` is flat (``resultType: "task"``); ``tasks/get`` answers a
detailed task with the result, error or ``inputRequests`` inlined (the inlined outcome's digest
is in the entry that settles it); ``tasks/update`` delivers ``inputResponses`` (audited as
``task_update``, by digest) and ``tasks/cancel`` asks; both are acknowledged with an empty
complete result. ``tasks/result`` and ``tasks/list`` do not exist there (``methods.py``).

Not yet: a status sent inside a request's own stream (dropped there, ``upstream/relay.py``) and the
extension's optional ``notifications/tasks`` on a listen stream. Never sends a task to an upstream
that did not declare it; never shows an upstream id.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from bastion.admission.states import ExecutionState
from bastion.audit.entry import AuditEntry, AuditEvent, digest_json
from bastion.call_context import call_context
from bastion.caller import Caller
from bastion.errors import BastionError, InvalidParams, OutcomeUnknown, UpstreamProtocolError
from bastion.ids import EvidenceSessionId
from bastion.metrics import CallMetrics
from bastion.policy.decide import server_visible, tool_visible
from bastion.policy.snapshot import Snapshot
from bastion.session.state import TransportSession
from bastion.store.base import ExecutionStep, Store
from bastion.store.tasks import NewTask, TaskRecord, TaskStatus
from bastion.tasks.support import (
    TASK_PARAM,
    asks_extension,
    check_runs_without_task,
    declares_extension,
    extension_opt_in,
    task_support,
)
from bastion.upstream.base import TASK_STATUS, UpstreamReplied
from bastion.upstream.fleet import ToolEntry, UpstreamFleet
from bastion.versions import TASKS_VERSIONS
from bastion.wire_value import wire_problem

__all__ = ["RELATED_TASK_META_KEY", "TaskRelay", "TaskWire", "relayed_tasks_capability"]

RELATED_TASK_META_KEY: Final[str] = "io.modelcontextprotocol/related-task"
# What the gateway relays of a server's ``tasks`` capability: its tool calls, listing, cancelling.
_RELAYED_TASKS: Final[dict[str, Any]] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
_TERMINAL_EXECUTION: Final[dict[TaskStatus, tuple[ExecutionState, str | None]]] = {
    TaskStatus.COMPLETED: (ExecutionState.COMPLETED, None),
    TaskStatus.FAILED: (ExecutionState.FAILED, "task_failed"),
    TaskStatus.CANCELLED: (ExecutionState.OUTCOME_UNKNOWN, "task_cancelled"),
}
logger = logging.getLogger(__name__)
_INVALID_PARAMS: Final[int] = -32602
_LIST_PAGE: Final[int] = 100
_HELD_STATUSES: Final[int] = 8  # per transport session: statuses pushed before their task's record
_UPSTREAM_PAGES: Final[int] = 100  # bound on one tasks/list's pages from one upstream
# The extension's acknowledgement of tasks/update and tasks/cancel: no task envelope.
_ACK: Final[dict[str, Any]] = {"resultType": "complete"}
# What a CreateTaskResult of the extension never carries (they live on tasks/get).
_NOT_ON_CREATION: Final[tuple[str, ...]] = ("result", "error", "inputRequests", "requestState")


class TaskWire(enum.Enum):
    """Which tasks a call is relayed as (module docstring)."""

    AUGMENTED = "2025-11-25"
    EXTENSION = "io.modelcontextprotocol/tasks"


def relayed_tasks_capability(declared: object) -> dict[str, Any] | None:
    """The ``tasks`` capability to announce for a server that declared ``declared``, or ``None``.

    Only a server that lets tool calls become tasks has anything to relay.
    """
    if not isinstance(declared, Mapping):
        return None
    tasks = declared.get("tasks")
    if not isinstance(tasks, Mapping):
        return None
    requests = tasks.get("requests")
    tools = requests.get("tools") if isinstance(requests, Mapping) else None
    if not (isinstance(tools, Mapping) and isinstance(tools.get("call"), Mapping)):
        return None
    return {key: value for key, value in _RELAYED_TASKS.items() if key == "requests" or key in tasks}


def _task_malformed() -> UpstreamProtocolError:
    return UpstreamProtocolError(
        "Upstream answered a task the gateway cannot read", may_have_acted=True, problem="task_malformed"
    )


def _as_created(task: Mapping[str, Any]) -> dict[str, Any]:
    """The extension's task as a ``CreateTaskResult`` shows it: without what lives on ``tasks/get``."""
    return {k: v for k, v in task.items() if k not in _NOT_ON_CREATION}


def _unknown_task() -> InvalidParams:
    # One answer for unknown, another owner's and expired: the id says nothing to a non-owner.
    return InvalidParams("Invalid params: unknown task")


class TaskRelay:
    """Creates, routes and settles the tasks of one gateway's calls (state lives in the store)."""

    def __init__(
        self,
        store: Store,
        fleet: UpstreamFleet,
        snapshot: Callable[[], Snapshot],
        *,
        metrics: CallMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._store = store
        self._fleet = fleet
        self._snapshot = snapshot

    # ------------------------------------------------------------------ creation (call.py)

    def relays_task(self, caller: Caller, entry: ToolEntry, params: Mapping[str, Any]) -> TaskWire | None:
        """How this call goes upstream as a task, or ``None`` (a plain call): by a tool and a server
        that take one, for a request that negotiated the extension, or asked for a task at a
        session-era revision that has them."""
        if task_support(entry.definition) not in ("optional", "required"):
            return None
        if asks_extension(caller.client_capabilities, params) and self.speaks_extension(entry.server):
            return TaskWire.EXTENSION
        if (
            caller.transport_session is None
            or caller.protocol_version not in TASKS_VERSIONS
            or not isinstance(params.get(TASK_PARAM), Mapping)
        ):
            return None
        declared = getattr(self._fleet.upstreams[entry.server], "server_capabilities", None)
        return TaskWire.AUGMENTED if relayed_tasks_capability(declared) is not None else None

    def speaks_extension(self, server: str) -> bool:
        """Whether ``server`` declares the tasks extension (at its handshake or discovery)."""
        upstream = self._fleet.upstreams.get(server)
        return upstream is not None and declares_extension(
            getattr(upstream, "server_capabilities", None), getattr(upstream, "discovered_capabilities", None)
        )

    def check_runs_without_task(self, entry: ToolEntry, tool: str) -> None:
        """A call not relayed as a task: refused when its tool runs only as one (``support.py``)."""
        if task_support(entry.definition) == "required":  # only then ask which wire its server speaks
            check_runs_without_task(entry.definition, tool, extension=self.speaks_extension(entry.server))

    def task_request(
        self, wire: TaskWire, params: Mapping[str, Any], request: dict[str, Any]
    ) -> dict[str, Any]:
        """``request`` (the upstream's ``tools/call``) asking for a task the way ``wire`` does."""
        if wire is TaskWire.EXTENSION:
            return extension_opt_in(request)
        return {**request, TASK_PARAM: self.task_param(params)}

    @staticmethod
    def task_param(params: Mapping[str, Any]) -> dict[str, Any]:
        """The augmentation as the upstream gets it: its ``ttl`` alone, when it is a whole number."""
        asked = params.get(TASK_PARAM)
        ttl = asked.get("ttl") if isinstance(asked, Mapping) else None
        return {"ttl": ttl} if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else {}

    async def created(
        self,
        caller: Caller,
        server: str,
        result: dict[str, Any],
        fields: dict[str, Any],
        evidence_session_id: str | None,
        wire: TaskWire = TaskWire.AUGMENTED,
    ) -> tuple[dict[str, Any], AuditEntry | None]:
        """Own the task ``result`` names and audit its creation; the result with the gateway's id,
        and the entry that records the creation.

        Raises:
            UpstreamProtocolError: the task is malformed (``problem`` ``task_malformed``).
            Conflict: the execution already has a task, or the upstream reused a task id.
        """
        flat = result.get("resultType") == "task"  # the extension's: the task's fields at the top
        task = result if flat else result.get("task")
        if flat is not (wire is TaskWire.EXTENSION):
            task = None  # the other wire's task: nothing the client asked for could read it
        upstream_id = task.get("taskId") if isinstance(task, Mapping) else None
        status = _status_of(task)
        if (
            not isinstance(task, Mapping)
            or not isinstance(upstream_id, str)
            or not upstream_id
            or status is None
        ):
            raise _task_malformed()
        if evidence_session_id is None:
            raise UpstreamProtocolError(  # pragma: no cover - the admitted entry opened the chain
                "The task's call has no evidence session", may_have_acted=True, problem="task_unrecorded"
            )
        principal = caller.principal
        record = await self._store.create_task(
            NewTask(
                caller.agent,
                principal.agent_session_id,
                server,
                upstream_id,
                fields["call_id"],
                EvidenceSessionId(evidence_session_id),
                fields.get("execution_id"),
                status,
                fields.get("tool"),
            ),
            now=caller.evidence.now(),
        )
        if self._metrics is not None:
            self._metrics.task_created(server)
        await self._relay_held_status(caller, server, upstream_id)
        entries = await caller.evidence.record_many(
            [
                (
                    AuditEvent.TASK_CREATED,
                    {**fields, "outcome": status.value, "detail": {"task_id": record.task_id}},
                )
            ]
        )
        last = entries[-1] if entries else None
        if flat:
            return {**_as_created(result), "taskId": record.task_id}, last
        return {**result, "task": {**task, "taskId": record.task_id}}, last

    async def replayed(self, caller: Caller, record: TaskRecord, wire: TaskWire) -> dict[str, Any] | None:
        """A replay of the execution that created ``record``: the same task, as its upstream shows it
        (a ``CreateTaskResult`` of ``wire``); ``None`` for a finished task its upstream no longer
        knows (the replay refusal then stands).

        Raises ``OutcomeUnknown`` when the upstream lost the task while it was live (recorded).
        """
        extension = wire is TaskWire.EXTENSION
        try:
            task = await self._poll(caller, record, extension=extension)
            if extension:
                return {**_as_created(task), "resultType": "task"}
            return {"task": task}
        except UpstreamReplied:
            if record.terminal:
                return None
            raise

    async def task_of_execution(self, caller: Caller, execution_id: Any) -> TaskRecord | None:
        return await self._store.task_of_execution(
            execution_id,
            agent=caller.agent,
            agent_session_id=caller.principal.agent_session_id,
            now=caller.evidence.now(),
        )

    # ------------------------------------------------------------------ tasks/* (methods.py)

    async def get(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        return await self._poll(caller, await self._owned(caller, params))

    async def get_detailed(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """The extension's ``tasks/get``: the task with its outcome or input requests inlined."""
        return await self._poll(caller, await self._owned(caller, params), extension=True)

    async def update(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """The extension's ``tasks/update``: the client's ``inputResponses`` to its task's server."""
        record = await self._owned(caller, params)
        responses = params.get("inputResponses")
        if not isinstance(responses, dict):
            raise InvalidParams("Invalid params: tasks/update needs an inputResponses object")
        await self._ask(caller, record, "tasks/update", extension=True, extra={"inputResponses": responses})
        detail = {"responses": len(responses), "responses_digest": digest_json(responses)}
        await self._audit(caller, record, AuditEvent.TASK_UPDATE, outcome=None, detail=detail)
        return dict(_ACK)

    async def cancel_requested(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """The extension's ``tasks/cancel``: asked of the server, acknowledged; the next
        ``tasks/get`` shows what became of the task."""
        record = await self._owned(caller, params)
        try:
            await self._ask(caller, record, "tasks/cancel", extension=True)
        except UpstreamReplied:
            await self._audit(caller, record, AuditEvent.TASK_CANCEL, outcome="refused")
            raise
        await self._audit(caller, record, AuditEvent.TASK_CANCEL, outcome="requested")
        return dict(_ACK)

    async def result(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        record = await self._owned(caller, params)
        answer = await self._ask(caller, record, "tasks/result", on_unknown=True)
        meta = answer.get("_meta")
        if isinstance(meta, dict) and RELATED_TASK_META_KEY in meta:
            answer = {**answer, "_meta": {**meta, RELATED_TASK_META_KEY: {"taskId": record.task_id}}}
        await self._audit(
            caller,
            record,
            AuditEvent.TASK_RESULT,
            outcome=None,
            detail={"result_digest": digest_json(answer)},
        )
        if not record.terminal:
            await self._poll(caller, record)  # the result is in: the task is terminal, learn how
        return answer

    async def cancel(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        record = await self._owned(caller, params)
        try:
            task = await self._ask(caller, record, "tasks/cancel")
        except UpstreamReplied:
            await self._audit(caller, record, AuditEvent.TASK_CANCEL, outcome="refused")
            raise
        await self._audit(caller, record, AuditEvent.TASK_CANCEL, outcome=_status_value(task))
        return await self._observed(caller, record, task)

    async def list_tasks(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        cursor = params.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise InvalidParams("Invalid params: tasks/list cursor must be a string")
        owned = await self._store.list_tasks(
            agent=caller.agent,
            agent_session_id=caller.principal.agent_session_id,
            now=caller.evidence.now(),
            after=cursor,
            limit=_LIST_PAGE,
        )
        upstream: dict[str, dict[str, dict[str, Any]]] = {}
        for server in dict.fromkeys(record.server for record in owned):
            upstream[server] = await self._upstream_tasks(caller, server)
        listed = []
        for record in owned:
            task = upstream[record.server].get(record.upstream_task_id)
            if task is not None:
                listed.append(await self._observed(caller, record, task))
        page: dict[str, Any] = {"tasks": listed}
        if len(owned) == _LIST_PAGE:
            page["nextCursor"] = owned[-1].task_id
        return page

    # ------------------------------------------------------------------ notifications/tasks/status

    async def status_notified(
        self, transport_session: TransportSession, server: str, params: dict[str, Any]
    ) -> dict[str, Any] | None:
        """A task status ``server`` pushed on ``transport_session``'s own upstream session or process:
        the params its client is told (the gateway's id), or ``None`` (dropped, with a log line).

        Only the owner's task maps (the store is keyed per owner, as for ``tasks/get``): an upstream
        id nobody here owns, a task at a revision without tasks, a revoked owner, a server its grants
        no longer name, or a status the gateway cannot read is dropped, never passed on. A status
        that differs from the recorded one settles the task as a poll that saw it would.
        """
        if transport_session.protocol_version not in TASKS_VERSIONS:
            _drop(server, "at a protocol revision without tasks")
            return None
        caller = Caller.of_transport_session(transport_session)
        upstream_id = params.get("taskId")
        if not isinstance(upstream_id, str) or _status_of(params) is None or wire_problem(params):
            _drop(server, "that the gateway cannot read")
            return None
        try:
            record = await self._task_of_upstream(caller, server, upstream_id)
            if record is None and transport_session.in_flight:
                # Maybe its creating call, still in flight: held for created() (a server may push a
                # status before its CreateTaskResult is read), then looked up once more in case the
                # creation was recorded meanwhile (whoever pops it relays it).
                _hold(transport_session, (server, upstream_id), params)
                record = await self._task_of_upstream(caller, server, upstream_id)
                if record is None:
                    _drop(server, "before its task is recorded (held while a call is in flight)")
                    return None
                held = transport_session.early_task_statuses or {}
                if held.pop((server, upstream_id), None) is None:
                    return None  # created() took it
            upstream = self._fleet.upstreams.get(server)
            if (
                record is None
                or upstream is None
                or not server_visible(self._snapshot(), caller.principal, server, upstream.namespace)
            ):
                _drop(server, "for a task no client of this session owns")
                return None
            task = await self._observed(caller, record, params)
        except BastionError as exc:  # a revoked owner, a store that cannot record it: the poll will say
            _drop(server, f"that could not be recorded ({exc.reason.value})", level=logging.WARNING)
            return None
        meta = task.get("_meta")
        if isinstance(meta, dict) and RELATED_TASK_META_KEY in meta:
            task = {**task, "_meta": {**meta, RELATED_TASK_META_KEY: {"taskId": record.task_id}}}
        return task

    # ------------------------------------------------------------------ steps

    async def _task_of_upstream(self, caller: Caller, server: str, upstream_id: str) -> TaskRecord | None:
        return await self._store.task_of_upstream(
            server,
            upstream_id,
            agent=caller.agent,
            agent_session_id=caller.principal.agent_session_id,
            now=caller.evidence.now(),
        )

    async def _relay_held_status(self, caller: Caller, server: str, upstream_id: str) -> None:
        """A status pushed before ``created`` recorded its task: relayed now, unless terminal (then
        the creating call is still settling; a poll records it) or no longer held."""
        transport_session = caller.transport_session
        held = transport_session.early_task_statuses if transport_session is not None else None
        params = held.pop((server, upstream_id), None) if held else None
        if transport_session is None or params is None or _status_of(params) in _TERMINAL_EXECUTION:
            return
        relayed = await self.status_notified(transport_session, server, params)
        channel = transport_session.upstream_sessions.channel
        if relayed is not None and channel is not None:
            await channel.notify(TASK_STATUS, relayed)

    async def _owned(self, caller: Caller, params: dict[str, Any]) -> TaskRecord:
        """The caller's task ``params.taskId`` names. Raises InvalidParams (unknown or not theirs),
        AgentSessionRevoked/Expired (the store checks the owner first, whatever the id)."""
        task_id = params.get("taskId")
        if not isinstance(task_id, str):
            raise InvalidParams("Invalid params: a taskId string is required")
        record = await self._store.get_task(
            task_id,
            agent=caller.agent,
            agent_session_id=caller.principal.agent_session_id,
            now=caller.evidence.now(),
        )
        upstream = self._fleet.upstreams.get(record.server) if record is not None else None
        # The grants in force still cover its tool (a reload may have taken it away): else unknown.
        if (
            record is None
            or upstream is None
            or not _still_granted(self._snapshot(), caller, record, upstream.namespace)
        ):
            raise _unknown_task()
        return record

    async def _ask(
        self,
        caller: Caller,
        record: TaskRecord,
        method: str,
        *,
        on_unknown: bool = False,
        extension: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``method`` for ``record`` at its server, on the caller's own upstream session or process
        (``extension``: negotiating the tasks extension for this request).

        Raises ``UpstreamReplied`` as the upstream answered; with ``on_unknown``, ``OutcomeUnknown``
        when a task still live in the store is unknown upstream (its fate is lost, recorded here).
        """
        snapshot = self._snapshot()
        request: dict[str, Any] = {"taskId": record.upstream_task_id, **(extra or {})}
        if extension:
            request = extension_opt_in(request)
        ctx = call_context(caller, snapshot, record.server, request)
        try:
            answer = await self._fleet.upstreams[record.server].call(method, request, ctx)
            problem = wire_problem(answer)
            if problem is not None:
                raise UpstreamProtocolError(
                    "Upstream answered a result the gateway cannot relay",
                    may_have_acted=True,
                    problem=problem,
                )
            return answer
        except UpstreamReplied as exc:
            if not (on_unknown and exc.error.get("code") == _INVALID_PARAMS and not record.terminal):
                raise
        await self._settle(caller, record, TaskStatus.FAILED, lost=True)
        raise OutcomeUnknown(
            "The task's upstream no longer knows it: its outcome is unknown", task_id=record.task_id
        )

    async def _poll(self, caller: Caller, record: TaskRecord, *, extension: bool = False) -> dict[str, Any]:
        return await self._observed(
            caller, record, await self._ask(caller, record, "tasks/get", on_unknown=True, extension=extension)
        )

    async def _observed(self, caller: Caller, record: TaskRecord, task: Mapping[str, Any]) -> dict[str, Any]:
        """``task`` as the upstream reported it, recorded (status) and shown with the gateway's id."""
        status = _status_of(task)
        if status is None:
            raise _task_malformed()
        if status is not record.status:
            await self._settle(caller, record, status, outcome=_inlined_outcome(task))
        return {**task, "taskId": record.task_id}

    async def _settle(
        self,
        caller: Caller,
        record: TaskRecord,
        status: TaskStatus,
        *,
        lost: bool = False,
        outcome: Any = None,
    ) -> None:
        """Record ``status``; the one request that moves the task to it audits the change and, at a
        terminal status, moves the execution to its terminal state in the same write."""
        moved = await self._store.set_task_status(
            record.task_id,
            status,
            agent=caller.agent,
            agent_session_id=caller.principal.agent_session_id,
            now=caller.evidence.now(),
        )
        if moved is None or not moved[1]:
            return  # another request (any replica) recorded it first, or it was terminal already
        if self._metrics is not None and status in _TERMINAL_EXECUTION:
            self._metrics.task_ended(record.server, status.value)
        if status not in _TERMINAL_EXECUTION:
            await self._audit(caller, record, AuditEvent.TASK_STATUS, outcome=status.value)
            return
        state, reason = _TERMINAL_EXECUTION[status]
        if lost:
            state, reason = ExecutionState.OUTCOME_UNKNOWN, "task_lost"
        step = None
        if record.execution_id is not None:
            execution = await self._store.get_execution(caller.agent, record.execution_id)
            if execution is not None and execution.state is ExecutionState.INVOKING:
                step = ExecutionStep(caller.agent, record.execution_id, state)
        detail: dict[str, Any] = {"task_status": status.value}
        if outcome is not None:  # the extension inlines the result (or error) on the terminal poll
            detail["result_digest"] = digest_json(outcome)
        await self._audit(
            caller,
            record,
            AuditEvent(state.value),
            outcome=state.value,
            reason=reason,
            detail=detail,
            step=step,
        )

    async def _audit(
        self,
        caller: Caller,
        record: TaskRecord,
        event: AuditEvent,
        *,
        outcome: str | None,
        reason: str | None = None,
        detail: dict[str, Any] | None = None,
        step: ExecutionStep | None = None,
    ) -> None:
        fields = {
            "call_id": record.call_id,
            "execution_id": record.execution_id,
            "server": record.server,
            "policy_version": self._snapshot().version,
            "outcome": outcome,
            "reason": reason,
            "detail": {"task_id": record.task_id, **(detail or {})},
        }
        await caller.evidence.record_many([(event, fields)], step=step)

    async def _upstream_tasks(self, caller: Caller, server: str) -> dict[str, dict[str, Any]]:
        """What ``server`` lists to the caller's own upstream session or process, by upstream id."""
        found: dict[str, dict[str, Any]] = {}
        snapshot, cursor = self._snapshot(), None
        for _ in range(_UPSTREAM_PAGES):
            request: dict[str, Any] = {"cursor": cursor} if cursor else {}
            ctx = call_context(caller, snapshot, server, request)
            page = await self._fleet.upstreams[server].call("tasks/list", request, ctx)
            tasks = page.get("tasks")
            if not isinstance(tasks, list):
                raise UpstreamProtocolError(
                    "Upstream answered tasks/list without tasks", problem="task_malformed"
                )
            found.update(
                (t["taskId"], t) for t in tasks if isinstance(t, dict) and isinstance(t.get("taskId"), str)
            )
            cursor = page.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        return found


def _still_granted(snapshot: Snapshot, caller: Caller, record: TaskRecord, namespace: str) -> bool:
    """Whether a grant of the caller still covers the task's tool (its server, for a row that
    names no tool: written before the store kept it)."""
    if record.tool is None:
        return server_visible(snapshot, caller.principal, record.server, namespace)
    return tool_visible(snapshot, caller.principal, record.server, namespace, record.tool)


def _hold(transport_session: TransportSession, key: tuple[str, str], params: dict[str, Any]) -> None:
    held = transport_session.early_task_statuses
    if held is None:
        held = transport_session.early_task_statuses = {}
    held.pop(key, None)
    held[key] = params  # the latest status of that id, newest last
    while len(held) > _HELD_STATUSES:
        del held[next(iter(held))]  # a hostile upstream's made-up ids push out only their own kind


def _drop(server: str, why: str, *, level: int = logging.DEBUG) -> None:
    # Debug by default: an upstream decides how often it sends one, so it must not flood the log.
    logger.log(level, "upstream %s sent a task status %s; dropped", server, why, extra={"server": server})


def _status_of(task: object) -> TaskStatus | None:
    status = task.get("status") if isinstance(task, Mapping) else None
    try:
        return TaskStatus(status) if isinstance(status, str) else None
    except ValueError:
        return None


def _inlined_outcome(task: Mapping[str, Any]) -> Any:
    """The result or error a detailed task (the extension's ``tasks/get``) inlines, or ``None``."""
    for key in ("result", "error"):
        if isinstance(task.get(key), Mapping):
            return task[key]
    return None


def _status_value(task: Mapping[str, Any]) -> str | None:
    status = _status_of(task)
    return None if status is None else status.value
