"""The upstream boundary (DESIGN sections 2 step 7, and 5).

An :class:`Upstream` is one configured MCP server. The call path asks it to
run one request on behalf of one client through :meth:`Upstream.call`,
handing it a :class:`CallContext`: the client's own relay (where progress,
logging and server-to-client requests for *this* call go), the client's
declared capabilities, and the per-client-session :class:`UpstreamSessions`
holder, so an upstream session is never shared between client sessions.

Owns: the contract and the verbatim upstream error. Never renders
responses; never sees client credentials.

Errors: transport failures are :mod:`bastion.errors` ``UpstreamError``
subclasses (``UpstreamUnavailable`` when nothing was sent,
``OutcomeUnknown`` when the upstream may have acted, ``UpstreamTimeout``);
a JSON-RPC error that the upstream itself answered is
:class:`UpstreamReplied`, relayed to the client as the upstream wrote it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio.abc

from bastion.errors import UpstreamProtocolError
from bastion.wire_value import wire_problem

__all__ = [
    "RESOURCE_UPDATED",
    "SURFACE_LIST_CHANGED",
    "CallContext",
    "CallRelay",
    "ClientDeclined",
    "ListChangedCallback",
    "ResourceUpdatedCallback",
    "SessionChannel",
    "Upstream",
    "UpstreamEra",
    "UpstreamHealth",
    "UpstreamReplied",
    "UpstreamSessions",
]


class UpstreamEra(enum.StrEnum):
    UNKNOWN = "unknown"
    SESSION = "session"  # initialize + Mcp-Session-Id (2025-03-26 … 2025-11-25)
    SESSIONLESS = "sessionless"  # server/discover, independent requests (2026-07-28)


class UpstreamReplied(Exception):
    """The upstream answered the request with a JSON-RPC error object; relayed verbatim."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        self.error = dict(error)
        super().__init__(str(self.error.get("message", "upstream error")))

    @classmethod
    def checked(cls, error: Mapping[str, Any]) -> UpstreamReplied:
        """The upstream's error object, to relay, once it is known to cross the wire (issue #12).

        Raises:
            UpstreamProtocolError: it holds what cannot be relayed (NaN, a lone surrogate,
                nesting too deep), named in ``problem``; the upstream may have acted.
        """
        problem = wire_problem(error)
        if problem is not None:
            raise UpstreamProtocolError(
                "Upstream answered an error the gateway cannot relay", may_have_acted=True, problem=problem
            )
        return cls(error)


class ClientDeclined(Exception):
    """The client answered a relayed server-to-client request with an error (or cannot take it)."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        self.error = dict(error)
        super().__init__(str(self.error.get("message", "client declined")))


class CallRelay(Protocol):
    """Where an upstream's messages about one call go: only to the client that made that call."""

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Deliver a notification on the call's own stream (progress already mapped back)."""

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Ask the calling client; returns its result or raises :class:`ClientDeclined`."""

    async def pause(self, retry_ms: int | None) -> None:
        """The upstream ended the call's stream to be polled (SEP-1699); the client's may end likewise."""


ListChangedCallback = Callable[[str], Coroutine[Any, Any, None]]
# An upstream's prompts or resources changed (issue 9): the fleet refreshes and clients are told.
SURFACE_LIST_CHANGED = frozenset(
    {"notifications/prompts/list_changed", "notifications/resources/list_changed"}
)
# A subscribed resource changed (issue 9): ``(server, upstream URI, upstream session or None)``,
# where a session names the client's own upstream session it came on and None a shared subscription.
RESOURCE_UPDATED = "notifications/resources/updated"
ResourceUpdatedCallback = Callable[[str, str, Any], None]
# A 2025-11-25 task's status, pushed by the server that runs it (issue 24): relayed to the task's
# owner only, under the gateway's id (``SessionChannel.task_status``, ``tasks/relay.py``).
TASK_STATUS = "notifications/tasks/status"


class SessionChannel(Protocol):
    """The way back to the one client that owns an upstream session, outside any request (issue 22).

    What an upstream session sends on its GET stream (a server-to-client request with no call in
    flight, a log message between calls, a list change) goes here, to that client and nobody else.
    """

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Deliver a notification on the client's own GET stream (log levels applied)."""

    def can_answer(self, method: str) -> bool:
        """Whether the client can be asked ``method`` here: it declared the capability, it is live."""

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Ask the client on its GET stream; returns its result or raises :class:`ClientDeclined`."""

    async def tools_changed(self, server: str) -> None:
        """``server``'s tools changed on this client's own upstream session: its view is stale, tell it."""

    async def task_status(self, server: str, params: dict[str, Any]) -> None:
        """``server`` pushed a task's status: delivered under the gateway's id if the task is this
        client's, else dropped (logged); a terminal status settles the task's execution."""


class UpstreamSessions:
    """Per client transport session: the upstream sessions opened for it, by server name.

    Holds opaque closers so this module stays free of concrete upstream
    types. Closing it closes every upstream session it opened, and nothing
    else; a closed holder refuses new sessions.
    """

    def __init__(self) -> None:
        self._by_server: dict[str, Any] = {}
        self.closed = False
        # Set by the session registry: how an upstream session reaches its owner outside a request.
        self.channel: SessionChannel | None = None
        # The client's catalog as its own upstream sessions show it (upstream/fleet.py), or None.
        self.view: Any = None

    def get(self, server: str) -> Any | None:
        return self._by_server.get(server)

    def put(self, server: str, upstream_session: Any) -> None:
        if self.closed:
            raise RuntimeError("transport session closed")
        self._by_server[server] = upstream_session

    def drop(self, server: str, upstream_session: Any) -> None:
        if self._by_server.get(server) is upstream_session:
            del self._by_server[server]

    def take_all(self) -> list[Any]:
        self.closed = True
        sessions = list(self._by_server.values())
        self._by_server.clear()
        return sessions

    def servers(self) -> list[str]:
        return list(self._by_server)


@dataclass
class CallContext:
    """Everything an upstream may know about the client behind one request."""

    relay: CallRelay | None
    client_capabilities: Mapping[str, Any]
    progress_token: str | int | None = None
    upstream_sessions: UpstreamSessions | None = None
    timeout_s: float = 60.0
    log_level: str | None = None
    # True when the client can be asked mid-call (a session-era client): an upstream
    # in the sessionless era that answers "input required" is then served by asking
    # the client over the call's stream and retrying; otherwise the result passes through.
    client_answers_requests: bool = False
    # The agent the call is made for: a parked input round (``input_rounds.py``) resumes only for it.
    owner: str | None = None
    # The attachment reference of the client behind the request (``ts_…`` its transport session,
    # ``sl_…`` its agent session's sessionless requests): what owns a stdio process (issue 22).
    owner_ref: str | None = None
    agent_session_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UpstreamHealth:
    name: str
    namespace: str
    kind: str
    era: str
    connected: bool
    tools: int
    detail: str | None


class Upstream(Protocol):
    """One configured upstream MCP server."""

    name: str
    namespace: str

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Connect (or launch) and learn the era; failures are recorded in :meth:`health`, not raised.

        Background work (supervision, listening) runs in ``task_group``, which outlives this call.
        """

    async def aclose(self) -> None:
        """Close every connection and stop any process this upstream launched."""

    async def list_tools(self) -> list[dict[str, Any]]:
        """The upstream's tools, all pages, as raw MCP tool objects."""

    async def call(self, method: str, params: dict[str, Any], ctx: CallContext) -> dict[str, Any]:
        """Send one request for one client and return the upstream's result.

        Raises:
            UpstreamReplied: the upstream answered with a JSON-RPC error.
            UpstreamUnavailable: nothing was sent.
            OutcomeUnknown: sent, and no result came back.
            UpstreamTimeout: no result within ``ctx.timeout_s`` (the upstream is told to cancel).
        """

    async def close_session(self, upstream_session: Any) -> None:
        """Close one upstream session opened for a client session."""

    async def notify_session(self, upstream_session: Any, method: str) -> None:
        """Pass a client's notification (``notifications/roots/list_changed``) to its own upstream session."""

    # Resource subscriptions (issue 9). Updates are reported through ``on_resource_updated``.
    on_resource_updated: ResourceUpdatedCallback | None

    def shares_resource_feed(self, ctx: CallContext) -> bool:
        """True when a subscription made for ``ctx`` serves every client of this upstream (counted by the
        gateway); False when it lives on the client's own upstream session."""

    async def subscribe_resource(self, uri: str, ctx: CallContext) -> None:
        """Subscribe to ``uri`` upstream; raises as :meth:`call` does."""

    async def unsubscribe_resource(self, uri: str, ctx: CallContext) -> None:
        """End the subscription to ``uri`` upstream; raises as :meth:`call` does."""

    def health(self) -> UpstreamHealth:
        """Current connection facts, for ``/readyz``."""
