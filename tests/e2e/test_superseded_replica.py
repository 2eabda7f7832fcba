"""A superseded replica and its runtimes go; its replacement registers its own (issue #11 point 4).

Real processes: ``bastion serve --generation g1`` with a launched stdio notes
server is paused (SIGSTOP) past its lease; a replacement ``bastion serve`` on
the same generation claims g1 at a higher epoch, and the moment it has, the
first is resumed (SIGCONT), so its runtime heartbeats race the replacement's
own runtime registration. The first must stop, say why and exit, its notes
process with it; the replacement's notes process holds the runtime slot.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import anyio
import pytest

from bastion.cli.serve import EXIT_SUPERSEDED
from bastion.store.sqlite import SqliteStore
from tests.e2e.test_serve_process import gone
from tests.e2e.test_workers_e2e import (
    LEASE_S,
    TAKEOVER_TIMEOUT_S,
    HoldingUpstream,
    gateway_process,
    holding_upstream,
    read_workers,
    until,
    write_config,
)

pytestmark = pytest.mark.anyio
__all__ = ["holding_upstream"]  # the fixture, imported for this module's tests


def _with_notes(config: Path, tmp_path: Path) -> Path:
    notes = (
        f'\n[servers.notes]\ncommand = "{sys.executable}"\nargs = ["-m", "bastion.examples.notes_server"]\n'
        f'env = {{ BASTION_NOTES_FILE = "{tmp_path / "notes.jsonl"}",'
        f' BASTION_COUNTER_FILE = "{tmp_path / "n.log"}" }}\n'
    )
    config.write_text(config.read_text().replace("\n[agents.", notes + "\n[agents.", 1))
    return config


async def _generation_epoch(data_dir: Path, generation: str) -> int:
    async with await SqliteStore.open(data_dir / "bastion.db") as store:
        held = await store.get_generation(generation)
    return 0 if held is None else int(held.epoch)


async def test_a_superseded_replica_exits_with_its_runtime_and_the_replacement_registers_its_own(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """Resumed after a replacement took g1: it says why, exits 4 with its notes process; the new one runs."""
    config = _with_notes(write_config(tmp_path / "gateway.toml", holding_upstream.url), tmp_path)
    data_dir = tmp_path / "data"
    async with gateway_process(config, data_dir, "g1", tmp_path / "first.log") as first:
        [old_runtime] = await until(
            data_dir, lambda workers: [w for w in workers.values() if w.role == "upstream"]
        )
        old_pid = int(old_runtime.provenance["pid"])
        first.signal(signal.SIGSTOP)
        try:

            async def resume_once_taken() -> None:
                with anyio.fail_after(TAKEOVER_TIMEOUT_S):
                    while await _generation_epoch(data_dir, "g1") < 2:
                        await anyio.sleep(0.05)
                first.signal(signal.SIGCONT)

            await anyio.sleep(LEASE_S * 1.5)  # the paused holder's lease runs out
            async with anyio.create_task_group() as tg:
                tg.start_soon(resume_once_taken)
                async with gateway_process(config, data_dir, "g1", tmp_path / "second.log") as second:
                    with anyio.fail_after(TAKEOVER_TIMEOUT_S):
                        await first.logged(
                            "this worker was superseded by a newer epoch; it stops serving and exits"
                        )
                        assert await first.process.wait() == EXIT_SUPERSEDED
                    [gateway] = [
                        w
                        for w in (await read_workers(data_dir)).values()
                        if w.role == "gateway" and w.epoch == 2
                    ]
                    [new_runtime] = await until(
                        data_dir,
                        lambda workers: [
                            w
                            for w in workers.values()
                            if w.role == "upstream"
                            and w.provenance.get("launched_by") == gateway.worker_id
                            and w.epoch is not None
                        ],
                    )
                    with anyio.fail_after(TAKEOVER_TIMEOUT_S):
                        while not gone(old_pid):
                            await anyio.sleep(0.05)
                    async with await SqliteStore.open(data_dir / "bastion.db") as store:
                        slot = await store.get_generation("upstream:g1:notes")
                    assert second.process.returncode is None
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                first.signal(signal.SIGCONT)
    assert slot is not None and slot.holder == new_runtime.worker_id
    assert new_runtime.provenance["pid"] != old_pid and os.getpid() != old_pid
