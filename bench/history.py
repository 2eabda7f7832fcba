"""A store that already holds a long history, for "cost flat as history grows" (issue 28).

    .venv/bin/python bench/history.py --data-dir DIR [--store postgresql://...]
                                      [--entries 1000000] [--executions 100000]

Fills the store of a data directory that no gateway has used yet (the SQLite
file in it, or the PostgreSQL database of ``--store``) through the store's own
operations, as a gateway writes them: closed evidence chains of
``--entries-per-chain`` entries each (a genesis, the attestation, ``completed``
entries, the close, written whole with a claim beside it, as a short-lived
chain is), and ``--executions`` executions taken to ``completed``
(reserve, invoking, outcome) by a worker of its own generation, which then
withdraws. A gateway started on the data directory afterwards adopts the store
(it holds no owner record yet) and serves on top of that history; ``run.py
--history`` does exactly this before it measures. The claims are placeholders,
not signed TRACE claims: nothing on the call path reads old claims.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bastion.admission.states import ExecutionState
from bastion.audit.chain import ChainBuilder, CloseReason
from bastion.audit.entry import AuditEvent
from bastion.audit.tee import no_attestation
from bastion.ids import AgentId, CallId, Epoch, EvidenceSessionId, ExecutionId, WorkerId
from bastion.store.base import Store
from bastion.store.select import open_store

__all__ = ["fill_history"]

_GENERATION = "bench-history"
_CONCURRENCY = 32  # writers at once: the engines group-commit them, as under a gateway's load


def _chain(index: int, entries: int, agent: str, key_id: str, t0: datetime) -> ChainBuilder:
    at = t0 + timedelta(seconds=index)
    builder = ChainBuilder.open(
        session_id=f"ev_{index:032x}", agent=agent, key_id=key_id, at=at, policy_version="bench"
    )
    builder.bind_attestation(no_attestation("benchmark history"), at=at)
    for seq in range(entries - 3):
        builder.append(
            AuditEvent.COMPLETED,
            at=at + timedelta(microseconds=seq + 1),
            call_id=f"call_{index:012x}{seq:012x}",
            server="tools",
            tool="echo",
            args_digest="sha256:" + "c" * 64,
            decision="allow",
            outcome="completed",
        )
    builder.close(CloseReason.SHUTDOWN, at=at + timedelta(milliseconds=900))
    return builder


async def _write_chains(store: Store, chains: int, per_chain: int, worker: WorkerId, epoch: Epoch) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    queue = iter(range(chains))

    async def writer() -> None:
        for index in queue:
            builder = _chain(index, per_chain, "bench", "bench-history", t0)
            genesis, *rest = builder.entries
            await store.open_chain(
                EvidenceSessionId(f"ev_{index:032x}"),
                genesis,
                worker=worker,
                epoch=epoch,
                then=rest,
                closed_with_claim={"bench": "history", "head": builder.head.hash},
            )

    await asyncio.gather(*(writer() for _ in range(_CONCURRENCY)))


async def _write_executions(store: Store, executions: int, worker: WorkerId, epoch: Epoch) -> None:
    queue = iter(range(executions))
    agent = AgentId("bench")

    async def writer() -> None:
        for index in queue:
            execution = ExecutionId(f"history-{index:09d}")
            binding, call_id = secrets.token_hex(32), CallId(f"call_h{index:023x}")
            await store.reserve_execution(
                agent, execution, binding, call_id=call_id, worker=worker, epoch=epoch
            )
            await store.mark_invoking(agent, execution, worker=worker, epoch=epoch)
            await store.record_outcome(agent, execution, ExecutionState.COMPLETED, worker=worker, epoch=epoch)

    await asyncio.gather(*(writer() for _ in range(_CONCURRENCY)))


async def fill_history(
    url: str | None, data_dir: Path, *, entries: int, executions: int, per_chain: int = 100
) -> dict[str, Any]:
    """Write the history into the store of ``data_dir`` (an existing directory) or ``url``.

    Returns what was written and how long it took.
    """
    if per_chain < 4:
        raise ValueError("a chain holds at least a genesis, the attestation, one entry and the close")
    started = time.perf_counter()
    store = await open_store(url, data_dir)
    try:
        now = datetime.now(UTC)
        worker = WorkerId(f"bench-history-{secrets.token_hex(4)}")
        await store.register_worker(worker, "gateway", {"launched_by": "bench/history.py"}, now=now)
        epoch = await store.claim_generation(_GENERATION, worker, now=now, lease_s=60.0)
        chains = max(1, entries // per_chain)
        await _write_chains(store, chains, per_chain, worker, epoch)
        chains_s = time.perf_counter() - started
        await _write_executions(store, executions, worker, epoch)
        await store.withdraw_liveness(worker, now=datetime.now(UTC), reason="bench history written")
    finally:
        await store.aclose()
    return {
        "chains": chains,
        "entries": chains * per_chain,
        "executions": executions,
        "chains_s": round(chains_s, 1),
        "took_s": round(time.perf_counter() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/history.py", description=__doc__)
    parser.add_argument("--data-dir", type=Path, required=True, help="a data directory no gateway has used")
    parser.add_argument(
        "--store", help="a postgresql:// database instead of the data directory's SQLite file"
    )
    parser.add_argument("--entries", type=int, default=1_000_000, help="audit entries (default 1,000,000)")
    parser.add_argument("--executions", type=int, default=100_000, help="finished executions (100,000)")
    parser.add_argument("--entries-per-chain", type=int, default=100, help="entries per closed chain (100)")
    args = parser.parse_args(argv)
    if (args.data_dir / "keys").exists():
        parser.error(f"{args.data_dir} was used by a gateway: fill a new data directory")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    written = asyncio.run(
        fill_history(
            args.store,
            args.data_dir,
            entries=args.entries,
            executions=args.executions,
            per_chain=args.entries_per_chain,
        )
    )
    print(
        f"history: {written['entries']:,} entries in {written['chains']:,} chains, "
        f"{written['executions']:,} executions, in {written['took_s']} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
