"""Pins in the evidence chain: a changed definition, and an operator's decision (issue 27).

Both are written to the chain of :data:`PIN_AUDIT_AGENT` at the replica that
saw or made them: a change with both digests (the definitions themselves are
in the store, shown by ``bastion pins show``), a decision with the operator,
the digests and the outcome. Never the definitions' text: it is the
upstream's, hostile, and may be large.
"""

from __future__ import annotations

from collections.abc import Callable

from bastion.audit.chain import CloseReason
from bastion.audit.entry import AuditEvent, Decision
from bastion.audit.scope import EvidenceScope
from bastion.errors import StoreError
from bastion.ids import AgentId
from bastion.pinning.book import DefinitionChange
from bastion.store.pins import PinRecord

__all__ = ["PIN_AUDIT_AGENT", "PinAudit"]

#: The chain pin entries go to: no agent acts, the gateway and its operator do.
PIN_AUDIT_AGENT = AgentId("bastion-pins")


class PinAudit:
    """Writes pin entries through the gateway's evidence scopes; a store failure goes to ``failed``."""

    def __init__(
        self, evidence_for: Callable[[AgentId], EvidenceScope], failed: Callable[[StoreError], None]
    ) -> None:
        self._evidence_for = evidence_for
        self._failed = failed

    async def changed(self, change: DefinitionChange) -> None:
        await self._record(
            AuditEvent.DEFINITION_CHANGED,
            server=change.server,
            tool=change.name,
            decision=Decision.DENY.value,
            reason=change.action,
            detail=change.describe(),
        )

    async def decided(self, pin: PinRecord, digest: str, previous_digest: str, *, approve: bool) -> None:
        await self._record(
            AuditEvent.PIN_DECIDED,
            server=pin.server,
            tool=pin.name,
            decision=(Decision.ALLOW if approve else Decision.DENY).value,
            reason="approved" if approve else "rejected",
            detail={
                "kind": pin.kind.value,
                "name": pin.name,
                "offered_digest": digest,
                "pinned_digest": previous_digest,
                "decided_by": pin.decided_by,
            },
        )

    async def _record(self, event: AuditEvent, **fields: object) -> None:
        scope = self._evidence_for(PIN_AUDIT_AGENT)
        try:
            await scope.record(event, **fields)
            await scope.close(CloseReason.REQUEST_END)
        except StoreError as exc:
            self._failed(exc)
