"""``completion/complete`` through the gateway, for prompt and resource-template references (issue 9).

The reference is routed as a ``prompts/get`` or ``resources/read`` would be: a prompt by
its exposed name (``prompts.py``), a template by its mapped URI (``uris.py``). Steps as
in ``call.py``: (4) the grant decision (a hidden reference is answered as unknown),
(7) the request on the caller's own upstream session with the upstream's own name or
template, (8) the audit entry, then the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bastion.call import strip_reserved_meta
from bastion.caller import Caller
from bastion.errors import InvalidParams
from bastion.policy.snapshot import Snapshot
from bastion.surface.limits import SurfaceLimits
from bastion.surface.prompts import PromptPath
from bastion.surface.relay import AccessRecord, decide_resource, send_recorded, upstream_context
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["CompletionPath"]


class CompletionPath:
    """Completes one argument of a prompt or a resource template for one caller."""

    def __init__(
        self,
        fleet: UpstreamFleet,
        snapshot: Callable[[], Snapshot],
        prompts: PromptPath,
        limits: SurfaceLimits | None = None,
    ) -> None:
        self._fleet = fleet
        self._snapshot = snapshot
        self._prompts = prompts
        self._limits = limits

    async def complete(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """Raises ``InvalidParams`` (malformed ref), ``UnknownPrompt``/``UnknownResource`` (audited),
        ``UpstreamReplied`` (verbatim) or ``UpstreamError``."""
        snapshot = self._snapshot()
        ref = params.get("ref")
        if not isinstance(ref, dict) or ref.get("type") not in ("ref/prompt", "ref/resource"):
            raise InvalidParams("Invalid params: completion/complete needs a ref/prompt or ref/resource ref")
        record = AccessRecord(caller, "completion/complete", params, snapshot)
        # (4) Route the reference and decide it; hidden is answered as unknown.
        if ref["type"] == "ref/prompt":
            name = ref.get("name")
            if not isinstance(name, str):
                raise InvalidParams("Invalid params: a ref/prompt needs a string name")
            entry = await self._prompts.resolve(caller, snapshot, name, record)
            server, upstream_ref = entry.server, {**ref, "name": entry.upstream_name}
        else:
            uri = ref.get("uri")
            if not isinstance(uri, str):
                raise InvalidParams("Invalid params: a ref/resource needs a string uri")
            server, target = await decide_resource(self._fleet, snapshot, caller, uri, record, self._limits)
            upstream_ref = {**ref, "uri": target.uri}
        # (7) Invoke on the caller's own upstream session; (8) the entry, then the answer.
        request = {**strip_reserved_meta(params), "ref": upstream_ref}
        upstream = self._fleet.upstreams[server]
        return await send_recorded(
            record, upstream, "completion/complete", request, upstream_context(caller, snapshot, server)
        )
