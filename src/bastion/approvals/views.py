"""What an approver sees of one approval request: the wire form of the admin API and CLI (issue 27).

Arguments appear only when the grant showed them (they were stored only
then); the binding digest always, since it is what the approval is bound to.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bastion.store.approvals import ApprovalRecord

__all__ = ["approval_json"]


def approval_json(record: ApprovalRecord) -> dict[str, Any]:
    return {
        "approval_id": record.approval_id,
        "state": record.state.value,
        "agent": record.agent,
        "human": record.human,
        "agent_session_id": record.agent_session_id,
        "server": record.server,
        "tool": record.tool,
        "arguments_shown": record.arguments is not None,
        "arguments": None if record.arguments is None else dict(record.arguments),
        "binding": record.binding,
        "execution_id": record.execution_id,
        "call_id": record.call_id,
        "evidence_session_id": record.evidence_session_id,
        "grant": record.grant,
        "approvers": list(record.approvers),
        "requested_at": _iso(record.requested_at),
        "expires_at": _iso(record.expires_at),
        "decided_at": _iso(record.decided_at),
        "decided_by": record.decided_by,
        "note": record.note,
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")
