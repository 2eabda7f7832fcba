"""The client end of a call relay: messages an upstream sends about one call (DESIGN section 5).

A :class:`StreamRelay` is made for one client request and writes only to
that request's :class:`~bastion.transport.channel.ResponseChannel`. A
server-to-client request is offered only when the client declared the
capability, only in the session era (the sessionless era has no back
channel), and its answer is matched by a gateway-minted id registered on
the client's own transport session.
"""

from __future__ import annotations

from typing import Any

import anyio

from bastion.session.state import PendingClientRequest, TransportSession
from bastion.transport.channel import ResponseChannel
from bastion.upstream.base import ClientDeclined
from bastion.upstream.capability_sets import required_capability

__all__ = ["StreamRelay"]

_CLIENT_ANSWER_TIMEOUT_S = 600.0


class StreamRelay:
    """Relays one upstream request's messages to the one client request that caused it."""

    def __init__(self, channel: ResponseChannel, transport_session: TransportSession | None) -> None:
        self._channel = channel
        self._transport_session = transport_session

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._channel.message({"jsonrpc": "2.0", "method": method, "params": params})

    async def pause(self, retry_ms: int | None) -> None:
        await self._channel.pause(retry_ms)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        transport_session = self._transport_session
        capability = required_capability(method)
        if transport_session is None or capability is None:
            raise ClientDeclined({"code": -32601, "message": f"{method} cannot be relayed to this client"})
        if capability not in transport_session.client_capabilities:
            raise ClientDeclined({"code": -32601, "message": f"the client did not declare {capability}"})
        relay_id = transport_session.next_relay_id()
        pending = PendingClientRequest()
        transport_session.client_requests[relay_id] = pending
        try:
            sent = await self._channel.message(
                {"jsonrpc": "2.0", "id": relay_id, "method": method, "params": params}
            )
            if not sent:
                raise ClientDeclined({"code": -32603, "message": "the client's request stream is closed"})
            with anyio.move_on_after(_CLIENT_ANSWER_TIMEOUT_S):
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
