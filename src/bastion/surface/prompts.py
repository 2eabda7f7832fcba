"""``prompts/list`` and ``prompts/get`` through the gateway (issue 9).

Prompts are one surface like tools: named ``<namespace><separator><prompt>`` (the
transparent server's keep their own names), merged by ``upstream/fleet.py`` with the
tools' collision rule (a name two servers offer stays with its holder; at start the
gateway refuses to run). Steps as in ``call.py``: (4) the grant decision against the
snapshot in force (prompt patterns match the upstream prompt name), a hidden prompt
answered like an unknown one; (7) sent on the caller's own upstream session;
(8) the audit entry (decision, digests), then the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bastion.admission.rounds import RoundStates
from bastion.call import strip_reserved_meta
from bastion.caller import Caller
from bastion.errors import (
    ArgumentConstraintFailed,
    DefinitionChanged,
    GrantDenied,
    InvalidParams,
    UnknownPrompt,
)
from bastion.pinning.book import check_not_withheld
from bastion.policy.decide import SurfaceKind, decide_surface, surface_visible
from bastion.policy.snapshot import Snapshot
from bastion.surface.limits import SurfaceLimits
from bastion.surface.relay import AccessRecord, send_in_rounds, upstream_context
from bastion.surface.uris import expose_uri
from bastion.upstream.catalog import ToolEntry
from bastion.upstream.fleet import UpstreamFleet

__all__ = ["PromptPath"]


class PromptPath:
    """Lists and gets prompts for one caller against the snapshot in force."""

    def __init__(
        self,
        fleet: UpstreamFleet,
        snapshot: Callable[[], Snapshot],
        limits: SurfaceLimits | None = None,
        rounds: RoundStates | None = None,
    ) -> None:
        self._fleet = fleet
        self._snapshot = snapshot
        self._limits = limits
        self._rounds = rounds if rounds is not None else RoundStates()

    async def view(self, caller: Caller, snapshot: Snapshot) -> Mapping[str, ToolEntry]:
        """Every prompt this caller's upstreams show it: an owned stdio server's from its own process."""
        return await self._fleet.prompt_view(lambda server: upstream_context(caller, snapshot, server))

    async def visible(self, caller: Caller, snapshot: Snapshot) -> list[ToolEntry]:
        return [
            entry
            for entry in (await self.view(caller, snapshot)).values()
            if surface_visible(
                snapshot,
                caller.principal,
                SurfaceKind.PROMPT,
                entry.server,
                entry.namespace,
                entry.upstream_name,
            )
        ]

    async def list_prompts(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        # One page, as tools/list's.
        visible = await self.visible(caller, self._snapshot())
        return {"prompts": [dict(entry.definition) for entry in visible]}

    async def resolve(
        self,
        caller: Caller,
        snapshot: Snapshot,
        name: str,
        record: AccessRecord,
        arguments: dict[str, Any] | None = None,
    ) -> ToolEntry:
        """(4) The prompt this caller names, decided against ``snapshot`` (with ``arguments``, a get's).

        Raises:
            UnknownPrompt: no such prompt, or hidden by grants (then audited as ``grant_denied``).
            ArgumentConstraintFailed: every covering grant's ``arguments_schema`` refuses (audited).
            RateLimited: an allowing grant's rate limit is spent (audited).
        """
        entry = (await self.view(caller, snapshot)).get(name)
        unknown = UnknownPrompt(f"Unknown prompt: {name}", prompt=name)
        if entry is None:
            await record.refused(unknown)
            raise unknown
        record.target(entry.server, entry.upstream_name)
        try:
            decision = decide_surface(
                snapshot,
                caller.principal,
                SurfaceKind.PROMPT,
                entry.server,
                entry.namespace,
                entry.upstream_name,
                arguments,
            )
        except GrantDenied as exc:
            await record.refused(exc)
            raise unknown from None
        except ArgumentConstraintFailed as exc:
            await record.refused(exc)
            raise
        try:
            check_not_withheld(entry)  # issue 27: a changed prompt is refused until approved
        except DefinitionChanged as exc:
            await record.refused(exc)
            raise
        await record.charge(self._limits, decision)
        return entry

    async def get(self, caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
        """Get one prompt.

        Raises:
            InvalidParams: no string ``name``.
            UnknownPrompt: no prompt of that name the caller may see (audited).
            UpstreamReplied: the upstream answered with an error (relayed verbatim).
            UpstreamError: the upstream failed.
        """
        snapshot = self._snapshot()
        name = params.get("name")
        if not isinstance(name, str):
            raise InvalidParams("Invalid params: prompts/get needs a string name")
        record = AccessRecord(caller, "prompts/get", params, snapshot)
        # (4) Grant decision: hidden is answered as unknown; the audit keeps grant_denied.
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            raise InvalidParams("Invalid params: prompts/get arguments must be an object")
        entry = await self.resolve(caller, snapshot, name, record, arguments or {})
        # (7) Invoke on the caller's own upstream session; (8) the entry, then the answer, whose
        #     embedded resources name URIs as the caller knows them.
        request = {**strip_reserved_meta(params), "name": entry.upstream_name}
        upstream = self._fleet.upstreams[entry.server]
        result = await send_in_rounds(
            record,
            self._rounds,
            entry.server,
            entry.upstream_name,
            arguments or {},
            upstream,
            request,
            upstream_context(caller, snapshot, entry.server),
        )
        transparent = self._fleet.is_transparent(entry.server)
        messages = [
            _map_embedded(message, entry.namespace, transparent) for message in result.get("messages") or []
        ]
        return {**result, "messages": messages}


def _map_embedded(message: Any, namespace: str, transparent: bool) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, dict):
        return message
    resource = content.get("resource")
    if not isinstance(resource, dict) or not isinstance(resource.get("uri"), str):
        return message
    exposed = expose_uri(namespace, resource["uri"], transparent=transparent) or resource["uri"]
    return {**message, "content": {**content, "resource": {**resource, "uri": exposed}}}
