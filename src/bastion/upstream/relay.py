"""Routing one upstream request's messages back to the client that asked (DESIGN section 5).

Owns the per-request rewrite of progress tokens: the upstream only ever sees
a token the gateway minted for this one request, and a progress
notification is mapped back to the client's own token before it reaches the
client's relay. Two clients using the same token never meet, by
construction: the mapping lives in this object, one per upstream request.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from bastion.upstream.base import CallContext, CallRelay, ClientDeclined
from bastion.upstream.era_paths import LOG_LEVELS

__all__ = ["RequestRelay", "mint_upstream_token"]

logger = logging.getLogger(__name__)
_token_counter = itertools.count(1)


def mint_upstream_token() -> str:
    # A process-local counter is enough: tokens are scoped to one upstream request.
    return f"bastion-p{next(_token_counter)}"


class RequestRelay:
    """The messages of one upstream request, routed to one client's relay."""

    def __init__(
        self, relay: CallRelay | None, client_token: str | int | None, *, log_level: str | None = None
    ) -> None:
        self.relay = relay
        self.client_token = client_token
        self.upstream_token = mint_upstream_token() if client_token is not None else None
        # Log messages below the client's level never reach it, whatever the upstream sends.
        quiet: tuple[str, ...] = ()
        if log_level is not None and log_level in LOG_LEVELS:
            quiet = LOG_LEVELS[: LOG_LEVELS.index(log_level)]
        self._quiet = frozenset(quiet)

    @classmethod
    def for_call(cls, ctx: CallContext, target: CallRelay | None = None) -> RequestRelay:
        """The relay of one call to ``target`` (default: the client's own), with the levels it hears.

        A sessionless client that asked for no level hears none (2026-07-28: absent means
        none); a session-era client that set none hears every level (its era's default).
        """
        relay = cls(target if target is not None else ctx.relay, ctx.progress_token, log_level=ctx.log_level)
        if ctx.log_level is None and not ctx.client_answers_requests:
            relay._quiet = frozenset(LOG_LEVELS)
        return relay

    def outbound_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the client's progress token replaced by this request's own token."""
        meta = params.get("_meta")
        if not isinstance(meta, dict) or "progressToken" not in meta:
            return params
        new_meta = dict(meta)
        if self.upstream_token is None:
            del new_meta["progressToken"]
        else:
            new_meta["progressToken"] = self.upstream_token
        return {**params, "_meta": new_meta}

    async def on_notification(self, method: str, params: dict[str, Any]) -> None:
        if self.relay is None:
            return
        if method == "notifications/progress":
            if (
                self.upstream_token is None
                or self.client_token is None
                or params.get("progressToken") != self.upstream_token
            ):
                logger.debug("dropped progress with a token this request did not issue")
                return
            await self.relay.notify(method, {**params, "progressToken": self.client_token})
            return
        if method == "notifications/message":
            if params.get("level") not in self._quiet:
                await self.relay.notify(method, params)
            return
        logger.debug("dropped upstream notification %s inside a request stream", method)

    async def on_pause(self, retry_ms: int | None) -> None:
        """The upstream ended this request's stream mid-call to be polled: tell the client's relay."""
        if self.relay is not None:
            await self.relay.pause(retry_ms)

    async def on_request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Relay a server-to-client request; raises :class:`ClientDeclined` when it cannot be answered."""
        if self.relay is None:
            raise ClientDeclined({"code": -32601, "message": f"{method} is not available for this request"})
        return await self.relay.request(method, params)
