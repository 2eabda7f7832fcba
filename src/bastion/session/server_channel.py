"""One client session's way back outside any request: its GET stream (DESIGN section 5, issue 22).

What the client's own upstream sessions send outside a request (a server-to-client request
while none of the client's calls is in flight there, a log message between calls, a list
change) is published on this session's GET stream, and on no other session's. A request is
offered only when the client declared the capability, and its answer is matched by a
gateway-minted id registered on this session, as a request relayed on a call's stream is
(``transport/relay.py``). Never blocks the upstream reader: a request waits in its own task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import orjson

from bastion.session.state import PendingClientRequest, TransportSession
from bastion.upstream.base import TASK_STATUS, ClientDeclined
from bastion.upstream.capability_sets import required_capability
from bastion.upstream.era_paths import LOG_LEVELS

__all__ = ["CLIENT_ANSWER_TIMEOUT_S", "ServerChannel", "TaskStatusHook"]

logger = logging.getLogger(__name__)
# An upstream's task status as this session's client may see it (``tasks/relay.py``): the params
# under the gateway's id, or ``None`` when the task is not this client's (dropped, logged there).
TaskStatusHook = Callable[[TransportSession, str, dict[str, Any]], Awaitable[dict[str, Any] | None]]

# A question on the GET stream may wait for a human (elicitation), but not forever.
CLIENT_ANSWER_TIMEOUT_S = 120.0


class ServerChannel:
    """The :class:`~bastion.upstream.base.SessionChannel` of one transport session."""

    def __init__(
        self, transport_session: TransportSession, task_status: TaskStatusHook | None = None
    ) -> None:
        self._transport_session = transport_session
        self._task_status = task_status

    def _publish(self, message: dict[str, Any]) -> bool:
        transport_session = self._transport_session
        if transport_session.terminated:
            return False
        try:
            payload = orjson.dumps(message)
        except TypeError:  # what orjson refuses (an integer past 64 bits) takes the stdlib path
            payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
        transport_session.server_stream.publish(payload)
        return True

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        level = self._transport_session.log_level
        quiet = LOG_LEVELS[: LOG_LEVELS.index(level)] if level in LOG_LEVELS else ()
        if method == "notifications/message" and params.get("level") in quiet:
            return  # below the level this client set
        self._publish({"jsonrpc": "2.0", "method": method, "params": params})

    def can_answer(self, method: str) -> bool:
        transport_session = self._transport_session
        capability = required_capability(method)
        return (
            not transport_session.terminated
            and capability is not None
            and capability in transport_session.client_capabilities
        )

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        transport_session = self._transport_session
        if not self.can_answer(method):
            raise ClientDeclined({"code": -32601, "message": f"{method} cannot be relayed to this client"})
        relay_id = transport_session.next_relay_id()
        pending = PendingClientRequest()
        transport_session.client_requests[relay_id] = pending
        try:
            if not self._publish({"jsonrpc": "2.0", "id": relay_id, "method": method, "params": params}):
                raise ClientDeclined({"code": -32603, "message": "the client session has ended"})
            with anyio.move_on_after(CLIENT_ANSWER_TIMEOUT_S):
                await pending.done.wait()
        finally:
            transport_session.client_requests.pop(relay_id, None)
        reply = pending.reply
        if reply is None:
            raise ClientDeclined({"code": -32001, "message": "the client did not answer"})
        if isinstance(reply.get("error"), dict):
            raise ClientDeclined(reply["error"])
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    async def tools_changed(self, server: str) -> None:
        # Its own upstream session's tools changed: its view is listed again on its next tools/list.
        self._transport_session.upstream_sessions.view = None
        self._publish({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})

    async def task_status(self, server: str, params: dict[str, Any]) -> None:
        transport_session = self._transport_session
        if transport_session.terminated:
            return
        if self._task_status is None:
            logger.debug("upstream %s sent a task status: tasks are not relayed here; dropped", server)
            return
        relayed = await self._task_status(transport_session, server, params)
        if relayed is not None:
            self._publish({"jsonrpc": "2.0", "method": TASK_STATUS, "params": relayed})
