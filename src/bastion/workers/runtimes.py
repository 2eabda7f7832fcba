"""Identities for the upstream runtimes Bastion launches: its stdio server processes (DESIGN section 6).

Every process ``upstream/stdio.py`` starts registers a worker identity of its
own (role ``upstream``) with its launch provenance (server, PID, host,
configuration version, the launching gateway worker), and claims its server's
slot: the generation ``upstream:<server>``, or ``upstream:<owner>:<server>``
when the registry is scoped to one gateway generation (two replicas on one
store each launch their own processes, so each needs its own slots). A process
with an owner (issue 22: a client transport session or an agent session) has a
slot of its own, ``…:<server>:<owner ref>``, and its owner in its provenance.

When a process exits, that one identity is marked failed (never its
namespace, never the fleet); the replacement the supervisor starts gets a new
identity and claims the slot with a strictly higher epoch. A process the
gateway itself stopped (a clean shutdown: the ``"stopped"`` event) has its
liveness withdrawn instead, and no failure is logged. The registry
heartbeats the runtimes it launched while they run, so ``bastion workers``
shows them live.

``StdioProcess`` calls its ``on_process_event(kind, process)`` hook
synchronously (``process.runtime_key`` names the process: its server, and its
owner when it has one); :meth:`RuntimeRegistry.process_hook` turns those calls into
events handled in order by :meth:`RuntimeRegistry.run`, off the call path.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from bastion.errors import Conflict, StaleEpoch, StoreError
from bastion.ids import Epoch, WorkerId
from bastion.store.base import Store
from bastion.store.failure_log import FailureLog
from bastion.workers.liveness import PidAlive, pid_alive, this_host
from bastion.workers.registry import WorkerRole, register_identity
from bastion.workers.withdrawal import withdraw_if_dead

__all__ = ["LaunchedRuntime", "ProcessHook", "RuntimeRegistry"]

logger = logging.getLogger(__name__)

ProcessHook = Callable[[str, Any], None]
"""``hook(kind, process)``: kind ``"started"``, ``"exited"`` (it died) or ``"stopped"`` (Bastion
ended it); ``process.name``, ``process.pid``, and ``process.runtime_key`` / ``process.owner_ref``
when it has an owner."""

_NAME_CHARS = re.compile(r"[^a-z0-9-]+")
# kind, runtime key, pid, config version, owner reference, namespace
_Event = tuple[str, str, int, str, str | None, str | None]


@dataclass(frozen=True, slots=True)
class LaunchedRuntime:
    """The identity of one running process of one server, and the epoch of its slot."""

    server: str
    worker: WorkerId
    epoch: Epoch
    pid: int


class RuntimeRegistry:
    """The identities of the upstream processes one gateway launched."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], datetime],
        lease_s: float,
        heartbeat_s: float,
        owner: str | None = None,
        launched_by: WorkerId | None = None,
        host: str | None = None,
        pid_alive: PidAlive = pid_alive,
        fence: Callable[[], Awaitable[None]] | None = None,
        credentials: Callable[[], tuple[WorkerId, Epoch]] | None = None,
    ) -> None:
        if not lease_s > 0 or not heartbeat_s > 0:
            raise ValueError("lease_s and heartbeat_s must be positive")
        self._store = store
        self._clock = clock
        self._lease_s = lease_s
        self._heartbeat_s = heartbeat_s
        self._owner = owner
        self._launched_by = launched_by
        self._host = host if host is not None else this_host()
        self._pid_alive = pid_alive
        # Raises StaleEpoch once the launching gateway lost its generation: its runtimes' heartbeats
        # end with it (issue #11 point 4), so a replacement on that generation can claim their slots.
        self._fence = fence
        # The launching gateway's (worker, epoch): it writes the attachment record that names an owned
        # process's owner, fenced like any ownership record (issue 22 point 1, seed 004).
        self._credentials = credentials
        self._running: dict[str, LaunchedRuntime] = {}
        # One line per change of the heartbeat's state in a store outage, not one every beat (#23).
        self._heartbeat_log = FailureLog(logger, "heartbeating the upstream runtimes")
        self._events: tuple[MemoryObjectSendStream[_Event], MemoryObjectReceiveStream[_Event]] | None = None
        self._settled = anyio.Event()

    def slot(self, server: str) -> str:
        """The generation a process of ``server`` (a runtime key: ``<server>[:<owner ref>]``) claims."""
        return f"upstream:{server}" if self._owner is None else f"upstream:{self._owner}:{server}"

    def current(self, server: str) -> LaunchedRuntime | None:
        """The running process of ``server`` as registered, or ``None``."""
        return self._running.get(server)

    async def register_launch(
        self, server_name: str, pid: int, config_version: str, owner: str | None = None
    ) -> tuple[WorkerId, Epoch]:
        """Register a fresh identity for a just-started process of ``server_name`` and claim its slot.

        The process it replaces (if this registry knew one) is marked failed
        first. While the slot's holder is live (another process not known to
        this registry, still heartbeating) the claim is retried until its lease
        runs out; a holder whose PID is dead on this host is withdrawn at once.
        ``server_name`` is a runtime key: ``<server>`` or ``<server>:<owner ref>``, for a process
        whose ``owner`` (its live client's reference) is recorded in its provenance.
        Raises :class:`StoreError` (:class:`Conflict` when the slot stayed held).
        """
        server = server_name.split(":", 1)[0]
        previous = self._running.pop(server_name, None)
        if previous is not None:
            await self.mark_failed(previous.worker, "replaced by a new launch")
        record = await register_identity(
            self._store,
            _worker_name(server),
            WorkerRole.UPSTREAM,
            {
                "started_by": "bastion",
                "launched_by": self._launched_by,
                "server": server,
                "owner": owner,
                "pid": pid,
                "host": self._host,
                "config_version": config_version,
                "cohort": f"upstream:{server}",
                "lease_s": self._lease_s,
            },
            now=self._clock(),
        )
        epoch = await self._claim(self.slot(server_name), record.worker_id)
        self._running[server_name] = LaunchedRuntime(server_name, record.worker_id, epoch, pid)
        logger.info(
            "upstream runtime registered",
            extra={"server": server_name, "worker": record.worker_id, "epoch": epoch, "pid": pid},
        )
        return record.worker_id, epoch

    async def _claim(self, slot: str, worker: WorkerId) -> Epoch:
        with anyio.fail_after(self._lease_s + 5):
            while True:
                await withdraw_if_dead(
                    self._store, slot, this_host=self._host, pid_alive=self._pid_alive, now=self._clock()
                )
                await self._withdraw_if_launcher_superseded(slot)
                try:
                    return await self._store.claim_generation(
                        slot, worker, now=self._clock(), lease_s=self._lease_s
                    )
                except Conflict:
                    # Held by a live process this registry did not launch: wait out its lease.
                    await anyio.sleep(min(1.0, self._lease_s / 4))

    async def _withdraw_if_launcher_superseded(self, slot: str) -> None:
        """A slot's holder launched by a gateway that lost its generation goes with that gateway (#11)."""
        held = await self._store.get_generation(slot)
        holder = None if held is None else await self._store.get_worker(held.holder)
        launcher_id = None if holder is None else holder.provenance.get("launched_by")
        if holder is None or not isinstance(launcher_id, str):
            return
        if holder.withdrawn_at is not None or holder.failed_at is not None:
            return
        launcher = await self._store.get_worker(WorkerId(launcher_id))
        if launcher is None or launcher.generation is None:
            return
        current = await self._store.get_generation(launcher.generation)
        if current is not None and (current.holder != launcher.worker_id or current.epoch != launcher.epoch):
            await self._store.withdraw_liveness(
                holder.worker_id, now=self._clock(), reason="its launching gateway was superseded"
            )

    async def mark_failed(self, worker_id: WorkerId, reason: str) -> None:
        """Mark that one identity failed (its slot becomes claimable). Raises :class:`StoreError`."""
        for server, running in list(self._running.items()):
            if running.worker == worker_id:
                del self._running[server]
        await self._store.mark_worker_failed(worker_id, reason, self._clock())
        logger.warning("upstream runtime failed", extra={"worker": worker_id, "reason": reason})

    async def heartbeat_once(self) -> None:
        """Heartbeat every running runtime; one that was superseded or failed is dropped.

        Nothing is heartbeated once the launching gateway is fenced (``fence`` raises ``StaleEpoch``).
        """
        if self._fence is not None:
            try:
                await self._fence()
            except StaleEpoch:
                return
            except StoreError as exc:
                self._heartbeat_log.failed(exc, note=" (skipped)")
                return
        for server, running in list(self._running.items()):
            try:
                await self._store.heartbeat(running.worker, self._clock())
            except StaleEpoch:
                self._running.pop(server, None)
            except StoreError as exc:
                self._heartbeat_log.failed(exc)
                return
        self._heartbeat_log.worked()

    # ------------------------------------------------------------------ the process hook

    def process_hook(self, config_version: str) -> ProcessHook:
        """A hook for ``StdioUpstream(on_process_event=...)``: queues the event for :meth:`run`."""
        send = self._event_streams()[0]

        def hook(kind: str, upstream: Any) -> None:
            pid = getattr(upstream, "pid", None)
            key = str(getattr(upstream, "runtime_key", upstream.name))
            owner = getattr(upstream, "owner_ref", None)
            namespace = getattr(upstream, "namespace", None)
            if kind in ("started", "exited", "stopped") and isinstance(pid, int):
                # After run() ended (shutdown) events have nowhere to go; the process hook must not raise.
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    send.send_nowait((kind, key, pid, config_version, owner, namespace))

        return hook

    async def run(self) -> None:
        """Handle process events in order and heartbeat the running runtimes, until cancelled.

        When it ends, later hook calls are dropped (the hook never raises).
        """
        send, receive = self._event_streams()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat_forever)
                async for kind, server, pid, config_version, owner, namespace in receive:
                    await self._handle(kind, server, pid, config_version, owner, namespace)
                tg.cancel_scope.cancel()  # settle() closed the events: every one is recorded
        finally:
            send.close()
            receive.close()
            self._settled.set()

    async def settle(self, timeout_s: float = 5.0) -> None:
        """At shutdown, after the processes stopped: record the events queued so far, then end :meth:`run`.

        Nothing is written after this returns (the store may close next).
        """
        if self._events is None:
            return
        self._events[0].close()
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s):
            await self._settled.wait()

    def _event_streams(self) -> tuple[MemoryObjectSendStream[_Event], MemoryObjectReceiveStream[_Event]]:
        if self._events is None:
            self._events = anyio.create_memory_object_stream[_Event](math.inf)
        return self._events

    async def _handle(
        self, kind: str, server: str, pid: int, config_version: str, owner: str | None, namespace: str | None
    ) -> None:
        try:
            if kind == "started":
                worker, _ = await self.register_launch(server, pid, config_version, owner)
                if owner is not None and namespace is not None and self._credentials is not None:
                    # Its owner, as the live attachment record proves it (never an environment flag).
                    writer, epoch = self._credentials()
                    await self._store.record_attachment(
                        worker, owner, namespace, self._clock(), writer=writer, epoch=epoch
                    )
                return
            running = self._running.get(server)
            if running is not None and running.pid == pid and kind == "stopped":
                await self._mark_stopped(server, running, pid)
            elif running is not None and running.pid == pid:
                await self.mark_failed(running.worker, f"process {pid} exited")
        except (StoreError, TimeoutError) as exc:
            logger.error(
                "could not record an upstream runtime event",
                extra={"server": server, "event": kind, "error": str(exc)},
            )

    async def _mark_stopped(self, server: str, running: LaunchedRuntime, pid: int) -> None:
        """A process the gateway stopped on purpose: not live any more, and no failure (#26 point 8)."""
        del self._running[server]
        await self._store.withdraw_liveness(
            running.worker, now=self._clock(), reason=f"process {pid} stopped by its gateway"
        )
        logger.info("upstream runtime stopped", extra={"worker": running.worker, "reason": "stopped"})

    async def _heartbeat_forever(self) -> None:
        while True:
            await anyio.sleep(self._heartbeat_s)
            await self.heartbeat_once()


def _worker_name(server: str) -> str:
    """``upstream-<server>`` in the identity alphabet (lowercase letters, digits, dashes)."""
    cleaned = _NAME_CHARS.sub("-", server.lower()).strip("-")[:31] or "server"
    return f"upstream-{cleaned}".rstrip("-")
