"""Naming the earlier attempt in a replay refusal (DESIGN section 3, issue #11 point 11).

A replay is refused with the earlier terminal outcome; so the two attempts can
be joined without guessing, the refusal also names the earlier attempt: its
``call_id`` (from the execution row) and, where the store holds it, the
evidence session, ``seq`` and entry hash of the entry that recorded its
outcome (an ``outcome_unknown`` written by a recovering worker included).
An entry still owed to the audit (storage was degraded) is not there yet: the
refusal then names what it can, and never fails because of the lookup.
"""

from __future__ import annotations

import logging
from typing import Any

from bastion.audit.entry import AuditEntry
from bastion.errors import StoreError
from bastion.ids import AgentId, ExecutionId
from bastion.store.base import Store

__all__ = ["last_entry_of_call", "name_earlier_attempt"]

logger = logging.getLogger(__name__)

_LOOKUP_LIMIT = 1_000


async def name_earlier_attempt(
    store: Store, agent: AgentId, execution_id: ExecutionId, data: dict[str, Any]
) -> None:
    """Add ``earlier_evidence_session_id``, ``earlier_seq`` and ``earlier_entry_hash`` to ``data``.

    ``data`` is the refusal's data, holding ``earlier_call_id`` and
    ``earlier_outcome``. Values stay ``None`` where the store has no entry.
    """
    data.setdefault("earlier_evidence_session_id", None)
    data.setdefault("earlier_seq", None)
    data.setdefault("earlier_entry_hash", None)
    try:
        entries = await store.find_entries(execution_id, agent=agent, limit=_LOOKUP_LIMIT)
    except StoreError as exc:
        logger.warning("could not look up the earlier attempt", extra={"reason": exc.reason.value})
        return
    found = _outcome_entry(entries, data.get("earlier_call_id"), data.get("earlier_outcome"))
    if found is not None:
        data["earlier_evidence_session_id"] = found.session_id
        data["earlier_seq"] = found.seq
        data["earlier_entry_hash"] = found.hash


async def last_entry_of_call(
    store: Store, agent: AgentId, execution_id: ExecutionId, call_id: str | None
) -> dict[str, Any] | None:
    """Where the evidence of one attempt ends: ``{session_id, seq, hash, ts}`` of its last entry.

    For the entry a recovering worker writes: it links the settled row to the dead worker's
    last word on that call, and ``ts`` is the last time anything was known of it. ``None``
    when the store holds no entry of the call (or cannot be read).
    """
    try:
        entries = await store.find_entries(execution_id, agent=agent, limit=_LOOKUP_LIMIT)
    except StoreError:
        return None
    found = _outcome_entry(entries, call_id, None)
    if found is None:
        return None
    return {"session_id": found.session_id, "seq": found.seq, "hash": found.hash, "ts": found.ts}


def _outcome_entry(entries: list[AuditEntry], call_id: str | None, outcome: str | None) -> AuditEntry | None:
    """The last entry of the earlier call that recorded its outcome, else its last entry."""
    of_call = [entry for entry in entries if call_id is not None and entry.call_id == call_id]
    recorded = [entry for entry in of_call if outcome is not None and entry.event == outcome]
    if recorded:
        return recorded[-1]
    return of_call[-1] if of_call else None
