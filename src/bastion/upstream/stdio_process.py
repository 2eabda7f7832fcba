"""One stdio server process: launched, supervised and stopped by Bastion (DESIGN sections 2 step 7, 5).

One MCP session on the process's pipes. A process either has one owner (a
client transport session or an agent session, ``upstream/stdio.py`` decides)
or none (the listing process, which builds the catalog, and a server the
operator declared ``scope = "shared"``). JSON-RPC ids are minted here,
progress tokens per request (``upstream/relay.py``), and a response is matched
only to the request that asked.

A server-to-client request (sampling, elicitation, roots) carries no wire
link to the call that caused it. On an owned process every call in flight is
the owner's, so it goes to the owner (through one of its calls, or, with none
in flight, on a GET stream of the owner: its ``channel``, ``upstream/owner_channels.py``);
on a process without an owner it is relayed only when exactly one client call
is in flight, otherwise it is refused to the upstream (fail closed: never
guess whom to ask). Log messages and list changes an owned process sends
between calls likewise reach its owner's channel, and nobody else.

The process is restarted with exponential backoff when it dies; every request
in flight at that moment fails with ``OutcomeUnknown`` (it was sent). It is
terminated, then killed, on shutdown.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.text import TextReceiveStream

from bastion import __version__
from bastion.children import guarded_command
from bastion.errors import (
    OutcomeUnknown,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamResponseTooLarge,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from bastion.policy.snapshot import ServerSpec
from bastion.upstream.base import (
    RESOURCE_UPDATED,
    SURFACE_LIST_CHANGED,
    TASK_STATUS,
    CallContext,
    ClientDeclined,
    ListChangedCallback,
    ResourceUpdatedCallback,
    SessionChannel,
    UpstreamEra,
    UpstreamHealth,
    UpstreamReplied,
)
from bastion.upstream.capability_sets import (
    BRIDGED_CAPABILITIES,
    EVERY_BRIDGED_CAPABILITY,
    required_capability,
)
from bastion.upstream.delivery import NotificationBuffer
from bastion.upstream.failure import describe_exit, describe_failure
from bastion.upstream.input_rounds import ParkedRounds, asks_in_rounds, round_trip
from bastion.upstream.lines import LineOverLimit, LineSplitter
from bastion.upstream.relay import RequestRelay
from bastion.upstream.stdio_counts import ProcessCounts
from bastion.versions import HANDSHAKE_VERSIONS, LATEST_HANDSHAKE_VERSION
from bastion.wire_value import loads_exact

__all__ = ["PROCESS_DIR", "StdioProcess", "declared_for"]

logger = logging.getLogger(__name__)

# List changes of an owned process: they change its owner's view alone (issue 22).
_OWNER_LIST_CHANGES = frozenset({"notifications/tools/list_changed", *SURFACE_LIST_CHANGED})


# In a stdio server's command, args, env values and cwd: the process's own private directory, for
# a server that keeps its state in files (server-memory's MEMORY_FILE_PATH): owners never share it.
PROCESS_DIR = "{process_dir}"


def declared_for(client_capabilities: Mapping[str, Any]) -> dict[str, Any]:
    """What an owner's process is told its client can do: what the client declared, of what is bridged."""
    return {
        key: dict(value) if isinstance(value, Mapping) else {}
        for key, value in client_capabilities.items()
        if key in BRIDGED_CAPABILITIES
    }


@dataclass
class _Pending:
    relay: RequestRelay
    capabilities: Mapping[str, Any]
    buffer: NotificationBuffer
    done: anyio.Event = field(default_factory=anyio.Event)
    reply: dict[str, Any] | None = None
    lost: bool = False
    # Why it was lost when the cause is known (an oversized message); else OutcomeUnknown.
    lost_because: Callable[[], UpstreamError] | None = None


class StdioProcess:
    """A supervised stdio MCP server process, with one owner or none.

    ``owner_ref`` is the attachment reference of its owner (``ts_…`` a transport session, ``sl_…``
    an agent session's sessionless requests), ``None`` for a process without an owner.
    ``spawn_gate`` bounds how many processes start at once (``upstream/stdio_pool.py``).
    """

    def __init__(
        self,
        spec: ServerSpec,
        *,
        on_list_changed: ListChangedCallback | None = None,
        restart_backoff_s: tuple[float, float] = (0.1, 5.0),
        on_process_event: Any = None,
        declared_capabilities: Mapping[str, Any] = EVERY_BRIDGED_CAPABILITY,
        owner_ref: str | None = None,
        spawn_gate: anyio.Semaphore | None = None,
        channel: SessionChannel | None = None,
        counts: ProcessCounts | None = None,
    ) -> None:
        assert spec.command is not None
        self.spec = spec
        self.name = spec.name
        self.owner_ref = owner_ref
        # The runtime registry's key for this process (workers/runtimes.py): one slot per owner.
        self.runtime_key = spec.name if owner_ref is None else f"{spec.name}:{owner_ref}"
        self._declared = dict(declared_capabilities)
        # The owner's way back outside a call (its GET stream), when the owner is a transport session.
        self.channel = channel
        # The level last sent with logging/setLevel for the owner (None: never sent).
        self.log_level: str | None = None
        self._spawn_gate = spawn_gate
        # Set once the first launch is ready or has failed: an owner's first call waits for no more.
        self.first_launch_settled = anyio.Event()
        # For the pool's idle reaper: calls in flight and when the last one ended (anyio clock).
        self.in_flight = 0
        self.last_used = 0.0
        # A private directory of this process (mode 0700), made at its first launch, kept across its
        # restarts, removed when it stops: what ``{process_dir}`` in its args, env and cwd names.
        self.process_dir: str | None = None
        self.namespace = spec.namespace
        self.era = UpstreamEra.SESSION
        self._on_list_changed = on_list_changed
        self.server_capabilities: dict[str, Any] = {}
        # Set by the fleet: prompts/resources list_changed from this upstream (issue 9).
        self.on_surface_changed: Callable[[str, str], Coroutine[Any, Any, None]] | None = None
        # Set by the gateway (surface/subscriptions.py): resources/updated from this process.
        self.on_resource_updated: ResourceUpdatedCallback | None = None
        # URIs subscribed on this process (counted by the gateway): made again after a restart.
        self._resource_subscriptions: set[str] = set()
        self._backoff = restart_backoff_s
        self._on_process_event = on_process_event
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._process: anyio.abc.Process | None = None
        self._ready = anyio.Event()
        # Set (then replaced) each time an attempt to start the process fails: waiters stop waiting.
        self._attempt_failed = anyio.Event()
        self._stderr_closed = anyio.Event()
        self._write_lock = anyio.Lock()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._parked = ParkedRounds()
        self._supervision = anyio.CancelScope()
        self._detail: str | None = "not started"
        self._stderr_tail: str | None = None
        self._exit_status: int | None = None
        self._tools = 0
        self.restarts = 0
        # Its server's counts (``upstream/stdio_counts.py``), shared with the server's other processes.
        self.counts = counts if counts is not None else ProcessCounts()
        self._attempt_ready = False  # whether the current attempt got through its handshake
        self.pid: int | None = None
        self._closing = False
        # Set when this process is ended for a known cause: its calls in flight fail with it.
        self._lost_because: Callable[[], UpstreamError] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group
        task_group.start_soon(self._supervise)
        with anyio.move_on_after(self.spec.timeout_s or 30.0):
            await self._ready_or_failed()
        if not self._ready.is_set():
            logger.warning("upstream %s not ready at start: %s", self.name, self._detail)

    async def _ready_or_failed(self) -> None:
        """Until the process is ready, or the next attempt to start it fails (a missing command: #26)."""
        ready, failed = self._ready, self._attempt_failed
        async with anyio.create_task_group() as tg:

            async def until_ready() -> None:
                await ready.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(until_ready)
            await failed.wait()
            tg.cancel_scope.cancel()

    @property
    def running(self) -> bool:
        """Whether its OS process is running now (launched, not yet ended)."""
        return self._process is not None

    def holds_work(self) -> bool:
        """Whether it has anything its owner still waits on: a call, a parked round, a subscription."""
        return self.in_flight > 0 or bool(self._pending) or bool(self._resource_subscriptions)

    def launch(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start supervising without waiting: an owner's first call waits for the handshake."""
        self._task_group = task_group
        task_group.start_soon(self._supervise)

    async def aclose(self) -> None:
        self._closing = True
        self._supervision.cancel()
        self._parked.cancel_all()
        await self._stop_process()
        if self.process_dir is not None:
            shutil.rmtree(self.process_dir, ignore_errors=True)  # its state ends with its owner
            self.process_dir = None

    def health(self) -> UpstreamHealth:
        return UpstreamHealth(
            name=self.name,
            namespace=self.namespace,
            kind="stdio",
            era=self.era.value,
            connected=self._ready.is_set(),
            tools=self._tools,
            detail=self._detail,
        )

    async def _supervise(self) -> None:
        with self._supervision:
            await self._supervise_forever()

    async def _supervise_forever(self) -> None:
        delay = self._backoff[0]
        while not self._closing:
            try:
                await self._run_once()
                delay = self._backoff[0]
            except Exception as exc:
                self._detail = describe_failure(
                    exc, exit_status=self._exit_status, stderr_tail=self._stderr_tail
                )
                logger.warning("upstream %s failed: %s", self.name, self._detail)
                self._attempt_failed.set()
                self._attempt_failed = anyio.Event()
            self.first_launch_settled.set()
            if self._closing:
                return
            if self._attempt_ready:
                self.counts.crashes += 1
            else:
                self.counts.spawn_failures += 1
            self.restarts += 1
            self.counts.restarts += 1
            await anyio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    def _expand(self, value: str) -> str:
        """``{process_dir}`` in a configured value: this process's own directory (issue 22)."""
        if PROCESS_DIR not in value:
            return value
        if self.process_dir is None:
            self.process_dir = tempfile.mkdtemp(prefix=f"bastion-{self.name}-")
        return value.replace(PROCESS_DIR, self.process_dir)

    async def _run_once(self) -> None:
        self._exit_status = self._stderr_tail = None
        self._attempt_ready = False
        self._stderr_closed = anyio.Event()
        env = {**os.environ, **{key: self._expand(value) for key, value in self.spec.env.items()}}
        command = [self._expand(part) for part in (self.spec.command or "", *self.spec.args)]
        cwd = self._expand(self.spec.cwd) if self.spec.cwd is not None else None
        gate = self._spawn_gate
        if gate is not None:
            await gate.acquire()  # released once the handshake is done or failed
        try:
            process = await anyio.open_process(
                guarded_command(command),  # ends with Bastion (#11)
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except BaseException:
            if gate is not None:
                gate.release()
            raise
        self._process = process
        self.pid = process.pid
        self.counts.spawns += 1
        if self._on_process_event is not None:
            self._on_process_event("started", self)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain_stderr, process)
                tg.start_soon(self._read_loop, process, tg.cancel_scope)
                try:
                    await self._handshake_while_running(process)
                finally:
                    if gate is not None:
                        gate.release()
                        gate = None
                if self._resource_subscriptions:
                    tg.start_soon(self._subscribe_again, set(self._resource_subscriptions))
                self._ready.set()
                self._attempt_ready = True
                if self.restarts:
                    self.counts.reconnects += 1
                self.first_launch_settled.set()
                self._detail = None
                await process.wait()
                tg.cancel_scope.cancel()
        finally:
            self._ready = anyio.Event()
            self._exit_status = process.returncode
            self._detail = describe_exit(process.returncode, self._stderr_tail)
            self._fail_pending()
            self._process = None
            await self._stop_process(process)
            if self._on_process_event is not None:
                # "stopped": ended by aclose (a clean stop: shutdown, its owner ended, idle), not a
                # failure to log (#26 point 8, issue 22).
                self._on_process_event("stopped" if self._closing else "exited", self)

    async def _handshake_while_running(self, process: anyio.abc.Process) -> None:
        """The handshake; a process that ends first fails it at once, not at the timeout (#26 point 1)."""
        exited = False
        async with anyio.create_task_group() as tg:

            async def watch_exit() -> None:
                nonlocal exited
                await process.wait()
                with anyio.move_on_after(1.0):
                    await self._stderr_closed.wait()  # its last stderr line names the cause
                exited = True
                tg.cancel_scope.cancel()

            tg.start_soon(watch_exit)
            await self._handshake()
            tg.cancel_scope.cancel()
        if exited:
            raise UpstreamUnavailable(
                f"upstream {self.name} ({self.spec.command}) exited before answering initialize"
            )

    async def _handshake(self) -> None:
        timeout_s = self.spec.timeout_s or 30.0
        with anyio.fail_after(timeout_s, reason=f"no answer to initialize within {timeout_s:g} s"):
            result = await self._request_raw(
                "initialize",
                {
                    "protocolVersion": LATEST_HANDSHAKE_VERSION,
                    "capabilities": self._declared,
                    "clientInfo": {"name": "bastion", "version": __version__},
                },
                RequestRelay(None, None),
                {},
            )
            capabilities = result.get("capabilities")
            # What it offers (resources, prompts, completions: issue 9).
            self.server_capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
            if result.get("protocolVersion") not in HANDSHAKE_VERSIONS:
                raise UpstreamProtocolError(
                    f"upstream {self.name} negotiated {result.get('protocolVersion')!r}"
                )
            await self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _fail_pending(self) -> None:
        for pending in self._pending.values():
            pending.lost, pending.lost_because = True, self._lost_because
            pending.done.set()
        self._pending.clear()
        self._lost_because = None

    async def _stop_process(self, process: anyio.abc.Process | None = None) -> None:
        process = process or self._process
        if process is None or process.returncode is not None:
            return
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(ProcessLookupError, OSError):
                os.killpg(process.pid, signal.SIGTERM)
            with anyio.move_on_after(2):
                await process.wait()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError, OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                with anyio.move_on_after(2):
                    await process.wait()

    async def _drain_stderr(self, process: anyio.abc.Process) -> None:
        assert process.stderr is not None
        try:
            async for chunk in TextReceiveStream(process.stderr, errors="replace"):
                for line in chunk.splitlines():
                    if line.strip():
                        self._stderr_tail = line[:200]  # named in /readyz if the process dies (issue #12)
                        logger.debug("upstream %s stderr: %s", self.name, line[:500])
        finally:
            self._stderr_closed.set()

    async def _read_loop(self, process: anyio.abc.Process, scope: anyio.CancelScope) -> None:
        """Hand each line to ``_on_line``; a line past ``max_response_bytes`` ends the process.

        No more than the bound (plus one chunk) is ever held: past it, reading stops, the
        process is killed (its calls in flight fail with ``UpstreamResponseTooLarge``) and the
        supervisor starts it again.
        """
        assert process.stdout is not None
        limit = self.spec.max_response_bytes
        splitter = LineSplitter(limit)
        async for chunk in process.stdout:
            try:
                lines = splitter.feed(chunk)
            except LineOverLimit:
                self._drop_oversized(process, limit)
                return
            for line in lines:
                if line.strip():
                    await self._on_line(line)
            await anyio.lowlevel.checkpoint()  # let request pumps drain between chunks

    def _drop_oversized(self, process: anyio.abc.Process, limit: int) -> None:
        logger.warning("upstream %s wrote a message over %d bytes; restarting it", self.name, limit)
        self._lost_because = lambda: UpstreamResponseTooLarge(
            f"upstream {self.name} wrote a message over {limit} bytes; its process was restarted",
            limit_bytes=limit,
        )
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(process.pid, signal.SIGKILL)

    async def _on_line(self, line: bytes) -> None:
        try:
            message = loads_exact(line)
        except ValueError:
            logger.warning("upstream %s wrote a line that is not JSON", self.name)
            return
        if not isinstance(message, dict):
            return
        method = message.get("method")
        if isinstance(method, str):
            raw_params = message.get("params")
            params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
            if "id" in message:
                assert self._task_group is not None
                self._task_group.start_soon(self._answer_server_request, message["id"], method, params)
            else:
                await self._on_notification(method, params, len(line))
            return
        request_id = message.get("id")
        pending = self._pending.get(request_id) if isinstance(request_id, int) else None
        if pending is None:
            logger.debug("upstream %s answered an unknown request id", self.name)
            return
        pending.reply = message
        pending.done.set()

    async def _on_notification(self, method: str, params: dict[str, Any], size: int = 0) -> None:
        if method == RESOURCE_UPDATED:
            uri = params.get("uri")
            if isinstance(uri, str) and self.on_resource_updated is not None:
                # An owned process is its owner's upstream session; one without an owner is everybody's.
                self.on_resource_updated(self.name, uri, None if self.owner_ref is None else self)
            return
        if self.owner_ref is not None and method in _OWNER_LIST_CHANGES:
            if self.channel is not None and self._task_group is not None:
                self._task_group.start_soon(self._tell_owner_list_changed, method)
            return  # the owner's own lists changed, not the gateway-wide catalog
        if method in SURFACE_LIST_CHANGED:
            if self.on_surface_changed is not None and self._task_group is not None:
                # Not awaited here: refreshing sends prompts/list, whose answer this loop must read.
                self._task_group.start_soon(self.on_surface_changed, self.name, method)
            return
        if method == "notifications/tools/list_changed":
            if self._on_list_changed is not None and self._task_group is not None:
                # Not awaited here: refreshing sends tools/list, whose answer this very loop must read.
                self._task_group.start_soon(self._on_list_changed, self.name)
            return
        if method == "notifications/progress":
            token = params.get("progressToken")
            for pending in list(self._pending.values()):
                if pending.relay.upstream_token is not None and pending.relay.upstream_token == token:
                    self._offer(pending, method, params, size)
                    return
            return
        if method == TASK_STATUS:
            if self.owner_ref is not None and self.channel is not None:
                await self.channel.task_status(self.name, params)  # in order: store writes, no upstream call
            else:
                logger.debug("upstream %s: a task status from a process without an owner; dropped", self.name)
            return
        if method == "notifications/message":
            only = self._only_caller()
            if only is not None:
                self._offer(only, method, params, size)
            elif self.owner_ref is not None and self.channel is not None:
                await self.channel.notify(method, params)  # between calls: the owner's GET stream
            return

    async def _tell_owner_list_changed(self, method: str) -> None:
        """The owner's view of this process's tools (or prompts, resources) changed: tell the owner."""
        assert self.channel is not None
        if method == "notifications/tools/list_changed":
            await self.channel.tools_changed(self.name)
        else:
            await self.channel.notify(method, {})

    def _offer(self, pending: _Pending, method: str, params: dict[str, Any], size: int) -> None:
        """Queue a notification for its client; never waits (a slow client must not stall this reader)."""
        pending.buffer.offer(method, params, size)
        if pending.buffer.overflowed and not pending.done.is_set():
            logger.warning("upstream %s: a client stopped reading its stream; its call is cut", self.name)
            pending.done.set()

    def _only_caller(self) -> _Pending | None:
        """The call whose client a message without a request link goes to, or ``None``.

        On an owned process every call is its owner's: the latest one carries it. Without an
        owner, only a lone call in flight is known to be the right one.
        """
        callers = [p for p in self._pending.values() if p.relay.relay is not None]
        if self.owner_ref is not None:
            return callers[-1] if callers else None
        return callers[0] if len(callers) == 1 else None

    async def _answer_server_request(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        reply: dict[str, Any]
        if method == "ping":
            reply = {"jsonrpc": "2.0", "id": request_id, "result": {}}
        else:
            capability = required_capability(method)
            only = self._only_caller()
            ask: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None
            if capability is not None and only is not None and capability in only.capabilities:
                ask = only.relay.on_request
            elif capability is not None and only is None and self.owner_ref is not None:
                # No call of the owner in flight: its GET stream (which checks what it declared).
                ask = self.channel.request if self.channel is not None else None
            if ask is None:
                reply = {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "error": {"code": -32601, "message": f"{method} cannot be relayed to a client"},
                }
            else:
                try:
                    result = await ask(method, params)
                    reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
                except ClientDeclined as exc:
                    reply = {"jsonrpc": "2.0", "id": request_id, "error": exc.error}
        with contextlib.suppress(UpstreamUnavailable):
            await self._write(reply)

    async def _write(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            raise UpstreamUnavailable(f"upstream {self.name} is not running")
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:
            try:
                await process.stdin.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise UpstreamUnavailable(f"upstream {self.name} pipe closed") from exc

    # ------------------------------------------------------------------ requests

    async def _await_ready(self, timeout_s: float) -> None:
        if self._ready.is_set():
            return
        if self.owner_ref is not None and not self.first_launch_settled.is_set():
            # An owner's first call: its process may wait its turn to spawn (spawn concurrency).
            with anyio.move_on_after(timeout_s):
                await self.first_launch_settled.wait()
            if self._ready.is_set():
                return
        with anyio.move_on_after(min(timeout_s, 10.0)):
            await self._ready_or_failed()
        if not self._ready.is_set():
            raise UpstreamUnavailable(f"upstream {self.name} is not running: {self._detail}")

    async def _request_raw(
        self, method: str, params: dict[str, Any], relay: RequestRelay, capabilities: Mapping[str, Any]
    ) -> dict[str, Any]:
        request_id = next(self._ids)
        pending = _Pending(relay, capabilities, NotificationBuffer(relay))
        self._pending[request_id] = pending
        sent = False
        try:
            # Written before the delivery group opens: a process that is gone raises its plain
            # UpstreamUnavailable (nothing sent), not a group around it (issue 24).
            await self._write(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": method,
                    "params": relay.outbound_params(params),
                }
            )
            sent = True
            async with anyio.create_task_group() as delivery:
                delivery.start_soon(pending.buffer.pump)
                try:
                    await pending.done.wait()
                finally:
                    pending.buffer.close()  # what is queued still goes out before the result
                    if not pending.done.is_set() or pending.buffer.overflowed:
                        delivery.cancel_scope.cancel()
        finally:
            self._pending.pop(request_id, None)
            if sent and (not pending.done.is_set() or pending.buffer.overflowed):
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(2),
                    contextlib.suppress(UpstreamUnavailable),
                ):
                    await self._write(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/cancelled",
                            "params": {"requestId": request_id, "reason": _cancel_reason(pending)},
                        }
                    )
        if pending.buffer.overflowed:
            raise OutcomeUnknown(f"upstream {self.name}: the client stopped reading its stream; call cut")
        if pending.lost_because is not None:
            raise pending.lost_because()
        if pending.lost or pending.reply is None:
            raise OutcomeUnknown(f"upstream {self.name} exited before answering")
        reply = pending.reply
        if isinstance(reply.get("error"), dict):
            raise UpstreamReplied.checked(reply["error"])
        result = reply.get("result")
        if not isinstance(result, dict):
            raise UpstreamProtocolError(f"upstream {self.name} answered without a result object")
        return result

    async def list_tools(self) -> list[dict[str, Any]]:
        timeout = self.spec.timeout_s or 30.0
        await self._await_ready(timeout)
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        with anyio.fail_after(timeout):
            for _ in range(100):
                params: dict[str, Any] = {"cursor": cursor} if cursor else {}
                result = await self._request_raw("tools/list", params, RequestRelay(None, None), {})
                page = result.get("tools")
                if not isinstance(page, list):
                    raise UpstreamProtocolError(f"{self.name}: tools/list result has no tools array")
                tools.extend(t for t in page if isinstance(t, dict))
                cursor = result.get("nextCursor")
                if not isinstance(cursor, str) or not cursor:
                    break
        self._tools = len(tools)
        return tools

    async def call(self, method: str, params: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        self.in_flight += 1
        try:
            return await self._call(method, params, ctx)
        finally:
            self.in_flight -= 1
            self.last_used = anyio.current_time()

    async def _call(self, method: str, params: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        await self._await_ready(ctx.timeout_s)
        await self._ensure_log_level(ctx.log_level)
        relay = RequestRelay.for_call(ctx)
        try:
            with anyio.fail_after(ctx.timeout_s):
                if asks_in_rounds(method, ctx) and self._task_group is not None:
                    # A sessionless client is asked by input-required rounds (input_rounds.py).
                    return await round_trip(
                        self._parked,
                        self._task_group,
                        params,
                        relay,
                        ctx,
                        lambda p, wire: self._request_raw(method, p, wire, ctx.client_capabilities),
                    )
                return await self._request_raw(method, params, relay, ctx.client_capabilities)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"upstream {self.name} did not answer within {ctx.timeout_s:g}s") from exc

    async def _ensure_log_level(self, level: str | None) -> None:
        """The owner's ``logging/setLevel`` reaches its own process before its next request."""
        if self.owner_ref is None or level is None or self.log_level == level:
            return
        if "logging" not in self.server_capabilities:
            return  # the server does not log: nothing to set, nothing lost
        with anyio.move_on_after(self.spec.timeout_s or 30.0), contextlib.suppress(UpstreamReplied):
            await self._request_raw("logging/setLevel", {"level": level}, RequestRelay(None, None), {})
        self.log_level = level

    async def notify(self, method: str) -> None:
        """Pass the owner's notification (``notifications/roots/list_changed``) to this process."""
        if self.owner_ref is None or not self._ready.is_set():
            return  # a process without an owner is nobody's to tell
        with contextlib.suppress(UpstreamUnavailable):
            await self._write({"jsonrpc": "2.0", "method": method})

    # Resource subscriptions (issue 9): the URIs are made again after a restart.

    async def subscribe_resource(self, uri: str, ctx: CallContext) -> None:
        await self.call("resources/subscribe", {"uri": uri}, ctx)
        self._resource_subscriptions.add(uri)

    async def unsubscribe_resource(self, uri: str, ctx: CallContext) -> None:
        self._resource_subscriptions.discard(uri)
        await self.call("resources/unsubscribe", {"uri": uri}, ctx)

    async def _subscribe_again(self, uris: set[str]) -> None:
        """A restarted process knows no subscription: the ones the gateway holds are made again."""
        for uri in sorted(uris):
            try:
                with anyio.fail_after(self.spec.timeout_s or 30.0):
                    await self._request_raw("resources/subscribe", {"uri": uri}, RequestRelay(None, None), {})
            except (UpstreamError, UpstreamReplied, TimeoutError) as exc:
                logger.warning("upstream %s: subscribing to %s again failed: %s", self.name, uri, exc)


def _cancel_reason(pending: _Pending) -> str:
    if pending.buffer.overflowed:
        return "the client stopped reading its stream"
    return "cancelled by the client"
