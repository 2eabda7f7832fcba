"""``bastion audit find``: every audit entry of one ``(agent, execution_id)`` in a store (issue #11).

An execution's evidence is spread over evidence sessions: each attempt's own
session, the session a recovering worker wrote ``outcome_unknown`` or
``released`` in, and sessions holding entries written late, after storage
recovered (``detail.late``, with ``detail.event_ts`` the time of the event).
This command reads the store under ``--data-dir`` (never creating one) and
lists them all, oldest first; ``--export DIR`` also writes each evidence
session's bundle (and claim, once it is closed) for ``bastion verify``.

Exit codes: 0 found (or nothing found: the output says so), 2 usage or I/O error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

__all__ = ["run_find"]


def run_find(
    data_dir: Path,
    execution_id: str,
    *,
    agent: str | None = None,
    export_dir: Path | None = None,
    store_url: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Print every entry carrying ``execution_id`` (of ``agent`` when given); 0, or 2 for no store.

    The store is the one ``bastion serve`` would open (``--store``, ``$BASTION_STORE``,
    else ``<data_dir>/bastion.db``, which must exist).
    """
    import os

    import anyio

    from bastion.audit.entry import AuditEntry
    from bastion.audit.export import write_bundle_file, write_claim_file
    from bastion.errors import ConfigError, StoreError
    from bastion.ids import AgentId, EvidenceSessionId, ExecutionId
    from bastion.store.select import SQLITE_FILE, choose_store_url, open_store

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    path = data_dir / SQLITE_FILE
    if not execution_id:
        print("error: --execution-id must not be empty", file=err)
        return 2
    try:
        url = choose_store_url(store_url, os.environ)
    except ConfigError as exc:
        print(f"error: {exc.message}", file=err)
        return 2
    if url is None and not path.is_file():  # never create a store where none is
        print(f"error: no store at {path}", file=err)
        return 2

    Chains = dict[str, tuple[list[AuditEntry], dict[str, Any] | None]]

    async def read() -> tuple[list[AuditEntry], dict[str, str], Chains]:
        store = await open_store(url, data_dir)
        try:
            entries = await store.find_entries(
                ExecutionId(execution_id), agent=AgentId(agent) if agent is not None else None
            )
            states: dict[str, str] = {}
            chains: Chains = {}
            for session_id in dict.fromkeys(entry.session_id for entry in entries):
                chain = await store.get_chain(EvidenceSessionId(session_id))
                claim = await store.get_claim(EvidenceSessionId(session_id))
                states[session_id] = (
                    "claim issued" if claim else ("closed" if chain and chain.closed else "open")
                )
                if export_dir is not None:
                    chains[session_id] = (await store.read_chain(EvidenceSessionId(session_id)), claim)
            return entries, states, chains
        finally:
            await store.aclose()

    try:
        entries, states, chains = anyio.run(read)
        for session_id, (chain_entries, claim) in chains.items():
            assert export_dir is not None
            export_dir.mkdir(parents=True, exist_ok=True)
            write_bundle_file(chain_entries, export_dir / f"{session_id}.jsonl")
            if claim:
                write_claim_file(claim, export_dir / f"{session_id}.claim.json")
    except StoreError as exc:
        print(f"error: {path if url is None else 'the store'}: {exc.message}", file=err)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or export_dir}: {exc.strerror or exc}", file=err)
        return 2
    who = f"agent {agent!r}" if agent is not None else f"{len({e.agent for e in entries})} agent(s)"
    carry = "entry carries" if len(entries) == 1 else "entries carry"
    print(
        f"{len(entries)} {carry} execution_id {execution_id!r} ({who}) in {len(states)} evidence session(s)",
        file=out,
    )
    by_agent: dict[str | None, list[AuditEntry]] = {}
    for entry in entries:
        by_agent.setdefault(entry.agent, []).append(entry)
    for owner, own in by_agent.items():
        # An execution_id is scoped under its agent: each agent's entries are a separate execution.
        count = f"{len(own)} entry" if len(own) == 1 else f"{len(own)} entries"
        print(f"agent {owner!r}, execution_id {execution_id!r}: {count}", file=out)
        for entry in own:
            detail = entry.detail or {}
            late = f" late event_ts={detail.get('event_ts')}" if detail.get("late") else ""
            print(
                f"  {entry.ts}  agent={entry.agent} session={entry.session_id} seq={entry.seq} "
                f"event={entry.event} call={entry.call_id} outcome={entry.outcome} reason={entry.reason} "
                f"worker={entry.worker} epoch={entry.epoch} hash={entry.hash}{late}",
                file=out,
            )
    for session_id, state in states.items():
        print(f"evidence session {session_id}: {state}", file=out)
    if export_dir is not None and states:
        print(f"bundles (and claims) written to {export_dir}", file=out)
    return 0
