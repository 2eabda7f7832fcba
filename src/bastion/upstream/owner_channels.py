"""How an owned stdio process reaches its owner between calls, whoever holds it (issue 22).

A transport session's process sits in that one client session; an agent session's process
(``scope = "agent_session"``, or a sessionless request's) sits in every client session of that
agent session that used it, and in none when its requests are sessionless. What it sends outside
a call goes to its owner's client sessions and to nobody else's: a notification (a log message at
each session's own level, a list change) to each of them, a server-to-client request to the one
most recently joined whose client can answer it (it declared the capability). Where no session of
the owner can take it, a notification is dropped and a request refused (``ClientDeclined``, which
the process answers as an error), each with a log line: never another owner's session, never a
wait for a client that cannot come.

Never: a session of another owner; a request to a client that did not declare its capability.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from bastion.upstream.base import ClientDeclined, SessionChannel

__all__ = ["OwnerChannels"]

logger = logging.getLogger(__name__)

# Dropped notifications are logged at the first and then at every this many, with the count.
_LOG_EVERY = 100


class OwnerChannels:
    """The :class:`~bastion.upstream.base.SessionChannel` of one owner's process over its owner's sessions.

    ``channels()`` gives the live client sessions' channels of the owner, oldest first.
    """

    def __init__(self, server: str, channels: Callable[[], Sequence[SessionChannel]]) -> None:
        self._server = server
        self._channels = channels
        self.dropped = 0

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        channels = self._channels()
        if not channels:
            self._drop(method)
        for channel in channels:
            await channel.notify(method, params)

    async def tools_changed(self, server: str) -> None:
        for channel in self._channels():
            await channel.tools_changed(server)

    async def task_status(self, server: str, params: dict[str, Any]) -> None:
        # Each session of the owner maps it (the store is keyed per owner); the first settles it.
        channels = self._channels()
        if not channels:
            self._drop("notifications/tasks/status")
        for channel in channels:
            await channel.task_status(server, params)

    def can_answer(self, method: str) -> bool:
        return any(channel.can_answer(method) for channel in self._channels())

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Ask the newest session of the owner that can answer; raises :class:`ClientDeclined` if none can."""
        for channel in reversed(self._channels()):
            if channel.can_answer(method):
                return await channel.request(method, params)
        logger.warning(
            "upstream %s asked %s between calls: no session of its owner can answer it; refused",
            self._server,
            method,
            extra={"server": self._server, "method": method},
        )
        raise ClientDeclined(
            {"code": -32601, "message": f"{method} cannot be relayed: no client session can answer"}
        )

    def _drop(self, method: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % _LOG_EVERY == 0:
            logger.warning(
                "upstream %s sent %s between calls: its owner has no client session to take it; dropped",
                self._server,
                method,
                extra={"server": self._server, "method": method, "dropped": self.dropped},
            )
