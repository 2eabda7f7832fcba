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
from typing import Any

import anyio
import orjson

from bastion.session.state import PendingClientRequest, TransportSession
from bastion.upstream.base import ClientDeclined
from bastion.upstream.capability_sets import required_capability
from bastion.upstream.era_paths import LOG_LEVELS

__all__ = ["CLIENT_ANSWER_TIMEOUT_S", "ServerChannel"]

# A question on the GET stream may wait for a human (elicitation), but not forever.
CLIENT_ANSWER_TIMEOUT_S = 120.0


class ServerChannel:
    """The :class:`~bastion.upstream.base.SessionChannel` of one transport session."""

    def __init__(self, transport_session: TransportSession) -> None:
        self._transport_session = transport_session

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
