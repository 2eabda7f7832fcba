"""Workers and fencing with real processes (DESIGN sections 3 and 6, issue #5).

Two ``bastion serve`` processes on one SQLite store (``--generation g1`` and
``g2``, one ``--data-dir``, a 1 s lease), in front of one HTTP upstream whose
``hold`` tool counts its side effect and answers only when the test releases
it (``tests/e2e/holding_upstream.py``). The first gateway is stopped (SIGSTOP) in
the middle of a call that carries an execution id; the second, a survivor,
takes its generation over with a higher epoch and recovers it; the first is
resumed (SIGCONT). Its late terminal write is refused, the execution is
``outcome_unknown``, the upstream acted once, the audit chain has no fork,
and the resumed gateway stops serving.

Waits are bounded and wait on what the processes say (their stdout protocol
lines and JSON log lines), never on elapsed time; the survivor's takeover
itself needs the lease (1 s) to run out in real time.

"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.admission.states import ExecutionState
from bastion.audit.entry import GENESIS_PREV, AuditEntry, compute_hash
from bastion.auth.bearer import hash_token
from bastion.cli.serve import EXIT_SUPERSEDED
from bastion.cli.verify_cmd import EXIT_OK
from bastion.ids import AgentId, ExecutionId
from bastion.store.base import WorkerRecord
from bastion.store.sqlite import SqliteStore
from bastion.workers.liveness import pid_alive, this_host
from bastion.workers.registry import describe_workers
from tests.e2e.conftest import TOKENS
from tests.e2e.test_evidence_e2e import (
    auth,
    reason_of,
    receipt_of,
    save_evidence,
    sessionless_call,
    verify_quietly,
    write_public_key,
)
from tests.e2e.test_transport_rules import MODERN_META, modern_headers, rpc

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
TAKEOVER_TIMEOUT_S = 30.0
LEASE_S = 1.0
EXECUTION_ID = "workers-e2e-fenced"
ADMIN_TOKEN = "admin-" + "q" * 40
# store/health.py logs this when a durable write fails; the text after the colon is StaleEpoch's message.
STORE_DEGRADED = "store degraded"


BIN = Path(sys.executable).parent
BASTION = (sys.executable, "-m", "bastion.cli.main")


# ---------------------------------------------------------------- processes


@dataclass
class HoldingUpstream:
    """``tests/e2e/holding_upstream.py``: ``HOLD <n>`` lines out, ``RELEASE`` lines in."""

    process: anyio.abc.Process
    url: str
    counter_file: Path
    stdout: BufferedByteReceiveStream

    async def next_hold(self) -> int:
        line = await self.stdout.receive_until(b"\n", 4096)
        words = line.decode().split()
        assert words[0] == "HOLD", line
        return int(words[1])

    async def release(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"RELEASE\n")

    def count(self) -> int:
        return len(self.counter_file.read_text().splitlines()) if self.counter_file.exists() else 0


@pytest.fixture
async def holding_upstream(tmp_path: Path) -> AsyncIterator[HoldingUpstream]:
    counter = tmp_path / "hold-counter.log"
    env = {**os.environ, "BASTION_COUNTER_FILE": str(counter)}
    process = await anyio.open_process(
        [sys.executable, "-m", "tests.e2e.holding_upstream"], cwd=REPO, env=env
    )
    try:
        assert process.stdout is not None
        stdout = BufferedByteReceiveStream(process.stdout)
        with anyio.fail_after(START_TIMEOUT_S):
            line = await stdout.receive_until(b"\n", 4096)
        words = line.decode().split()
        assert words[0] == "LISTENING", line
        yield HoldingUpstream(process, words[1], counter, stdout)
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(process)


async def _stop(process: anyio.abc.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        process.terminate()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    await process.aclose()


@dataclass
class GatewayProcess:
    """One ``bastion serve`` process; its JSON log lines are kept (and copied to ``log``)."""

    process: anyio.abc.Process
    url: str
    log: Path
    lines: list[dict[str, Any]] = field(default_factory=list)
    log_closed: anyio.Event = field(default_factory=anyio.Event)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def origin(self) -> str:
        return self.url.removesuffix("/mcp")

    async def pump_log(self) -> None:
        assert self.process.stderr is not None
        stream = BufferedByteReceiveStream(self.process.stderr)
        try:
            with self.log.open("ab") as copy:
                while True:
                    try:
                        line = await stream.receive_until(b"\n", 1 << 20)
                    except (anyio.EndOfStream, anyio.IncompleteRead):
                        return
                    copy.write(line + b"\n")
                    copy.flush()
                    with contextlib.suppress(ValueError):
                        self.lines.append(json.loads(line))
                    self._changed.set()
                    self._changed = anyio.Event()
        finally:
            self.log_closed.set()

    async def logged(self, message: str) -> dict[str, Any]:
        """The first log entry whose message is ``message``, waiting for it to be written."""
        while True:
            for entry in self.lines:
                if entry.get("msg") == message:
                    return entry
            await self._changed.wait()

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.process.pid, signum)


@contextlib.asynccontextmanager
async def gateway_process(
    config: Path, data_dir: Path, generation: str, log: Path, *extra: str
) -> AsyncIterator[GatewayProcess]:
    command = [
        str(BIN / "bastion"),
        "serve",
        "--port",
        "0",
        "--log-level",
        "warning",
        "--config",
        str(config),
        "--data-dir",
        str(data_dir),
        "--generation",
        generation,
        "--lease-s",
        str(LEASE_S),
        "--heartbeat-s",
        str(LEASE_S * 0.3),
        *extra,
    ]
    process = await anyio.open_process(command, cwd=REPO)
    async with anyio.create_task_group() as tg:
        try:
            assert process.stdout is not None
            running = GatewayProcess(process, "", log)
            tg.start_soon(running.pump_log)
            with anyio.fail_after(START_TIMEOUT_S):
                try:
                    line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    await running.log_closed.wait()
                    output = log.read_text()
                    raise AssertionError(f"gateway {generation} exited before ready:\n{output}") from None
            words = line.decode().split()
            assert words[:2] == ["BASTION", "READY"], line
            running.url = words[2]
            yield running
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            tg.cancel_scope.cancel()


def write_config(path: Path, upstream_url: str, *, extra: str = "") -> Path:
    agents = "".join(
        f'[agents.{name}]\ntoken_sha256 = "{hash_token(token)}"\n' for name, token in TOKENS.items()
    )
    path.write_text(
        f'[gateway]\nupstream_timeout_s = 60.0\n\n[servers.work]\nurl = "{upstream_url}"\n\n{agents}{extra}'
    )
    return path


# ---------------------------------------------------------------- store reads (the file, read-only)


def read_only(data_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{data_dir / 'bastion.db'}?mode=ro", uri=True)


def execution_row(data_dir: Path, execution_id: str) -> tuple[str, str, int] | None:
    with contextlib.closing(read_only(data_dir)) as conn:
        row = conn.execute(
            "SELECT state, worker, epoch FROM executions WHERE agent = 'alice' AND execution_id = ?",
            (execution_id,),
        ).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))


def all_chains(data_dir: Path) -> dict[str, list[tuple[AuditEntry, str, int]]]:
    """Every chain's committed entries in seq order, each with the worker and epoch that wrote it."""
    chains: dict[str, list[tuple[AuditEntry, str, int]]] = {}
    with contextlib.closing(read_only(data_dir)) as conn:
        rows = conn.execute("SELECT session_id, entry, worker, epoch FROM entries ORDER BY session_id, seq")
        for session_id, entry, worker, epoch in rows:
            chains.setdefault(session_id, []).append((AuditEntry.from_json(json.loads(entry)), worker, epoch))
    return chains


def assert_no_fork(entries: list[AuditEntry]) -> None:
    """seq 0..n-1 without a gap, each prev the previous hash, each hash recomputed."""
    assert [e.seq for e in entries] == list(range(len(entries)))
    prev = GENESIS_PREV
    for entry in entries:
        assert entry.prev == prev and entry.hash == compute_hash(entry.prev, entry.body())
        prev = entry.hash


async def raw_call(http: httpx.AsyncClient, url: str, name: str) -> httpx.Response:
    params = {"name": name, "arguments": {}, "_meta": MODERN_META}
    return await http.post(
        url, headers={**modern_headers("tools/call", name), **auth("alice")}, json=rpc("tools/call", params)
    )


# ---------------------------------------------------------------- the fencing scenario


async def test_a_paused_gateway_is_fenced_after_a_survivor_takes_its_generation_over(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """SIGSTOP mid-call, peer takeover, SIGCONT: late write refused, outcome_unknown, one effect, no fork."""
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url)
    data_dir = tmp_path / "data"
    answer: dict[str, Any] = {}
    async with (
        gateway_process(config, data_dir, "g1", tmp_path / "g1.log") as first,
        gateway_process(config, data_dir, "g2", tmp_path / "g2.log") as second,
        httpx.AsyncClient(timeout=90) as http,
    ):

        async def call_first() -> None:
            answer.update(await sessionless_call(http, first.url, "work__hold", execution_id=EXECUTION_ID))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_first)
            # 1. The upstream received the call (its side effect happened once); stop the first gateway.
            with anyio.fail_after(START_TIMEOUT_S):
                assert await holding_upstream.next_hold() == 1
            first.signal(signal.SIGSTOP)
            try:
                # 2. The survivor sees g1's lease run out, claims it at epoch 2 and recovers it.
                with anyio.fail_after(TAKEOVER_TIMEOUT_S):
                    takeover = await second.logged("took over a peer's generation")
                    await second.logged("recovered a taken-over generation")
                assert (takeover["generation"], takeover["previous_epoch"], takeover["epoch"]) == ("g1", 1, 2)
                row = execution_row(data_dir, EXECUTION_ID)
                assert row is not None and row[0] == "outcome_unknown" and row[2] == 2
                # 3. The upstream answers the stopped gateway, which then resumes.
                await holding_upstream.release()
            finally:
                first.signal(signal.SIGCONT)

        # 4. Its late terminal write is refused (StaleEpoch): the caller hears it was superseded (not
        #    a storage failure), with the outcome it observed; the store is not degraded for it.
        assert reason_of(answer) == "stale_epoch", answer
        assert "superseded" in answer["error"]["message"]
        assert answer["error"]["data"]["execution_id"] == EXECUTION_ID
        assert answer["error"]["data"]["observed_outcome"] == "completed"
        with anyio.fail_after(START_TIMEOUT_S):
            reported = await first.logged("late write refused (superseded); what it observed is recorded")
        assert execution_row(data_dir, EXECUTION_ID) == row  # untouched by the late write
        assert holding_upstream.count() == 1

        # 5. It stops serving and exits, saying why; it never reported its store degraded.
        with anyio.fail_after(START_TIMEOUT_S):
            await first.logged("this worker was superseded by a newer epoch; it stops serving and exits")
            assert await first.process.wait() == EXIT_SUPERSEDED
        assert STORE_DEGRADED not in first.log.read_text()

        # 6. The survivor still serves, and the same execution id is a replay of outcome_unknown.
        echo = await sessionless_call(http, second.url, "work__echo", {"text": "still here"})
        assert reason_of(echo) is None
        replay = await sessionless_call(http, second.url, "work__hold", execution_id=EXECUTION_ID)
        assert reason_of(replay) == "execution_replay"
        assert replay["error"]["data"]["earlier_outcome"] == "outcome_unknown"
        assert holding_upstream.count() == 1

        # 7. No fork: every chain links without a gap; the first's chain was closed by recovery at epoch 2,
        #    with nothing written under epoch 1 after it, and its claim verifies offline.
        chains = all_chains(data_dir)
        for entries in chains.values():
            assert_no_fork([e for e, _, _ in entries])
        first_chain = chains[receipt_of(answer)["evidence_session_id"]]
        events = [(e.event, epoch) for e, _, epoch in first_chain]
        assert (
            events[-1] == ("session_close", 2)
            and (first_chain[-1][0].detail or {}).get("close_reason") == "recovery"
        )
        assert [epoch for _, epoch in events] == sorted(epoch for _, epoch in events)
        key = write_public_key(data_dir, tmp_path / "public.pem")
        bundle, claim = await save_evidence(http, second.url, first_chain[0][0].session_id, tmp_path)
        code, output = verify_quietly(bundle, claim, key)
        assert code == EXIT_OK, output

        # 8. What the fenced worker observed is in the evidence, written by a current writer: a
        #    refused (stale_epoch) entry with the observed outcome, in a closed, verifiable session.
        late = chains[reported["evidence_session_id"]]
        [(entry, _, _)] = [(e, w, ep) for e, w, ep in late if e.reason == "stale_epoch"]
        assert (entry.execution_id, entry.outcome, entry.event) == (EXECUTION_ID, "completed", "refused")
        assert (entry.detail or {})["stale_epoch"] == 1 and late[-1][0].event == "session_close"
        bundle, claim = await save_evidence(http, second.url, entry.session_id, tmp_path)
        code, output = verify_quietly(bundle, claim, key)
        assert code == EXIT_OK, output

    # 9. The registry shows who held what: the first worker superseded, a recovery worker at epoch 2.
    async with await SqliteStore.open(data_dir / "bastion.db") as store:
        views = await describe_workers(
            store, now=datetime.now(UTC), lease_s=LEASE_S, pid_alive=pid_alive, this_host=this_host()
        )
        record = await store.get_execution(AgentId("alice"), ExecutionId(EXECUTION_ID))
    assert record is not None and record.state is ExecutionState.OUTCOME_UNKNOWN
    g1 = [v for v in views if v.generation == "g1"]
    assert {(v.role, v.epoch, v.holds_generation) for v in g1} == {
        ("gateway", 1, False),
        ("recovery", 2, True),
    }


# ---------------------------------------------------------------- waiting on wiring outside workers/


async def test_kill_9_of_a_launched_stdio_upstream_fails_only_that_runtime(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """kill -9 of the notes process: its identity is failed; the replacement gets a new identity, epoch 2."""
    notes = (
        f'\n[servers.notes]\ncommand = "{sys.executable}"\nargs = ["-m", "bastion.examples.notes_server"]\n'
        f'env = {{ BASTION_NOTES_FILE = "{tmp_path / "notes.jsonl"}",'
        f' BASTION_COUNTER_FILE = "{tmp_path / "n.log"}" }}\n'
    )
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url)
    config.write_text(config.read_text().replace("\n[agents.", notes + "\n[agents.", 1))
    data_dir = tmp_path / "data"
    async with (
        gateway_process(config, data_dir, "g1", tmp_path / "g1.log") as gateway,
        httpx.AsyncClient(timeout=60) as http,
    ):
        # Registration runs off the call path: wait (bounded) until the notes process has its identity.
        [old] = await until(
            data_dir, lambda workers: [w for w in workers.values() if w.role == "upstream"], timeout_s=5
        )
        assert old.provenance.get("server") == "notes" and old.epoch == 1
        os.kill(int(old.provenance["pid"]), signal.SIGKILL)
        # The supervisor restarts the process (with backoff); its exit fails that one identity.
        [fresh] = await until(
            data_dir,
            lambda workers: (
                [
                    w
                    for w in workers.values()
                    if w.role == "upstream" and w.worker_id != old.worker_id and w.epoch is not None
                ]
                if workers[old.worker_id].failed_at is not None
                else []
            ),
        )
        assert fresh.epoch == 2 and fresh.provenance["pid"] != old.provenance["pid"]
        assert reason_of(await sessionless_call(http, gateway.url, "work__echo", {"text": "ok"})) is None
        gateway_worker = [w for w in (await read_workers(data_dir)).values() if w.role == "gateway"]
        assert [w.failed_at for w in gateway_worker] == [None]


async def read_workers(data_dir: Path) -> dict[str, WorkerRecord]:
    async with await SqliteStore.open(data_dir / "bastion.db") as store:
        return {w.worker_id: w for w in await store.list_workers()}


async def until(
    data_dir: Path,
    found: Callable[[dict[str, WorkerRecord]], list[WorkerRecord]],
    *,
    timeout_s: float = TAKEOVER_TIMEOUT_S,
) -> list[WorkerRecord]:
    """Read worker records until ``found`` finds some: bounded, for what a gateway does in the background."""
    with anyio.fail_after(timeout_s):
        while True:
            matches = found(await read_workers(data_dir))
            if matches:
                return matches
            await anyio.sleep(0.05)


async def test_bastion_workers_reads_a_running_gateway(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """`bastion workers` (the real command): the gateway's own identity, live, holding g1 at epoch 1."""
    extra = f'\n[auth]\nadmin_token_sha256 = "{hash_token(ADMIN_TOKEN)}"\n'
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url, extra=extra)
    token_file = tmp_path / "admin.token"
    token_file.write_text(ADMIN_TOKEN)
    async with gateway_process(config, tmp_path / "data", "g1", tmp_path / "g1.log") as gateway:
        listed = await anyio.run_process(
            [*BASTION, "workers", "--url", gateway.url, "--admin-token-file", str(token_file), "--json"],
            check=False,
        )
        from_store = await anyio.run_process(
            [*BASTION, "workers", "--data-dir", str(tmp_path / "data")], check=False
        )
    assert listed.returncode == 0, listed.stderr.decode()
    [worker] = [w for w in json.loads(listed.stdout)["workers"] if w["role"] == "gateway"]
    assert (worker["generation"], worker["epoch"], worker["liveness"]) == ("g1", 1, "live")
    assert from_store.returncode == 0, from_store.stderr.decode()
    assert worker["worker_id"] in from_store.stdout.decode()


async def test_a_required_namespace_down_refuses_mutating_calls_only(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    """Required namespace not connected: increment refused required_namespace_not_connected; echo passes."""
    extra = (
        '\n[servers.down]\nurl = "http://127.0.0.1:9/mcp"\n'
        '\n[[requirements]]\nagent = "alice"\nnamespaces = ["down"]\n'
    )
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url, extra=extra)
    async with (
        gateway_process(config, tmp_path / "data", "g1", tmp_path / "g1.log") as gateway,
        httpx.AsyncClient(timeout=60) as http,
    ):
        refused = await sessionless_call(http, gateway.url, "work__increment")
        assert reason_of(refused) == "required_namespace_not_connected"
        assert reason_of(await sessionless_call(http, gateway.url, "work__echo", {"text": "read"})) is None
        assert holding_upstream.count() == 0
