"""The chain sessionless requests share survives a crash closed and claimed (DESIGN section 4).

A real ``bastion serve`` serves sessionless calls into its shared chain, is
killed with SIGKILL while that chain is open, and is started again on the same
data directory: recovery closes the chain with a claim, and the bundle with its
claim verifies offline. A clean stop (SIGTERM) closes it with reason
``shutdown`` instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import httpx
import orjson
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.ids import EvidenceSessionId
from bastion.store.sqlite import SqliteStore
from tests.e2e.conftest import Upstream
from tests.e2e.test_evidence_e2e import (
    bundle_entries,
    receipt_of,
    save_evidence,
    sessionless_call,
    verify_quietly,
    write_public_key,
)
from tests.e2e.test_execution_restart import write_config

pytestmark = pytest.mark.anyio

START_TIMEOUT_S = 60.0


@contextlib.asynccontextmanager
async def bastion_serve(
    config: Path, data_dir: Path, log: Path
) -> AsyncIterator[tuple[anyio.abc.Process, str]]:
    """``bastion serve`` until its READY line; killed on exit if still running."""
    command = [
        sys.executable, "-m", "bastion.cli.main", "serve", "--config", str(config),
        "--data-dir", str(data_dir), "--port", "0", "--lease-s", "1", "--heartbeat-s", "0.5",
    ]  # fmt: skip
    with log.open("ab") as stderr:
        process = await anyio.open_process(
            command, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        assert process.stdout is not None
        with anyio.fail_after(START_TIMEOUT_S):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
        words = line.decode().split()
        assert words[:2] == ["BASTION", "READY"], line
        yield process, words[2]
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


async def open_chains(data_dir: Path) -> list[str]:
    store = await SqliteStore.open(data_dir / "bastion.db")
    try:
        return [chain.session_id for chain in await store.list_open_chains()]
    finally:
        await store.aclose()


async def test_sigkill_leaves_the_shared_chain_to_recovery_which_closes_it_with_a_claim(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Killed with its shared chain open, the restarted gateway closes that chain; bundle and claim verify."""
    config = write_config(tmp_path / "gateway.toml", tools_upstream.url)
    data_dir = tmp_path / "data"
    log = tmp_path / "gateway.log"
    async with httpx.AsyncClient(timeout=20) as http:
        async with bastion_serve(config, data_dir, log) as (first, url):
            receipts = [
                receipt_of(await sessionless_call(http, url, "tools__echo", {"text": f"n{i}"}))
                for i in range(3)
            ]
            first.send_signal(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        session_id = receipts[0]["evidence_session_id"]
        assert {r["evidence_session_id"] for r in receipts} == {session_id}  # one shared chain
        assert await open_chains(data_dir) == [session_id]

        async with bastion_serve(config, data_dir, log) as (_, url):
            assert await open_chains(data_dir) == []  # recovered before it served
            bundle, claim = await save_evidence(http, url, session_id, tmp_path)
    entries = bundle_entries(bundle.read_bytes())
    assert entries[-1]["detail"] == {"close_reason": "recovery"}
    for receipt in receipts:  # every answered call's entry is in the recovered chain, as its receipt says
        assert entries[receipt["seq"]]["hash"] == receipt["entry_hash"]
    key = write_public_key(data_dir, tmp_path / "gateway.pem")
    code, output = verify_quietly(bundle, claim, key)
    assert code == 0, output


async def test_sigterm_closes_the_shared_chain_with_reason_shutdown(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A clean stop closes the open shared chain and stores its claim before the process exits."""
    config = write_config(tmp_path / "gateway.toml", tools_upstream.url)
    data_dir = tmp_path / "data"
    log = tmp_path / "gateway.log"
    async with httpx.AsyncClient(timeout=20) as http, bastion_serve(config, data_dir, log) as (process, url):
        receipt = receipt_of(await sessionless_call(http, url, "tools__echo", {"text": "bye"}))
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(START_TIMEOUT_S):
            assert await process.wait() == 0
    session_id = EvidenceSessionId(receipt["evidence_session_id"])
    store = await SqliteStore.open(data_dir / "bastion.db")
    try:
        claim = await store.get_claim(session_id)
        entries = await store.read_chain(session_id)
    finally:
        await store.aclose()
    assert claim is not None
    assert entries[-1].detail == {"close_reason": "shutdown"}
    assert orjson.dumps(claim)  # a stored claim, as issued
