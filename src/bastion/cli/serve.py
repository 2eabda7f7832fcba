"""``bastion serve``: load the configuration (or build the demo), run the gateway under uvicorn."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from anyio.abc import TaskStatus
from starlette.applications import Starlette

from bastion.app import create_app
from bastion.audit.recorder import MIN_MAX_ENTRIES
from bastion.auth.anonymous import refuse_anonymous_off_loopback
from bastion.auth.bearer import hash_token
from bastion.children import guarded_command
from bastion.cli.listen_address import listen_address_refusal
from bastion.errors import ConfigError
from bastion.gateway import RuntimeOptions
from bastion.heap import settle_after_start
from bastion.logs import configure_logging, say
from bastion.policy.load import load_snapshot, snapshot_from_mapping
from bastion.policy.snapshot import Snapshot
from bastion.store.select import choose_store_url, describe_store
from bastion.transport.limits import front_door_limits, uvicorn_options
from bastion.transport.rebinding import is_loopback

__all__ = ["EXIT_START_REFUSED", "EXIT_SUPERSEDED", "run_serve"]

logger = logging.getLogger(__name__)

DEMO_TOKEN_FILE = "demo-agent.token"  # noqa: S105 - a file name, not a secret
DEMO_ADMIN_TOKEN_FILE = "demo-admin.token"  # noqa: S105 - the demo's admin credential (issue #26 point 3)
EXIT_START_REFUSED = 3  # the gateway refused to start (held generation, unusable store): one line says why
EXIT_SUPERSEDED = 4  # a newer epoch took this worker's generation: it drained, stopped its runtimes, exited


def run_serve(
    config: Path | None,
    host: str,
    port: int,
    data_dir: Path,
    log_level: str,
    *,
    generation: str = "gateway-0",
    unsafe_no_audit: bool = False,
    lease_s: float = 10.0,
    heartbeat_s: float = 2.0,
    evidence_max_entries: int = 10_000,
    evidence_max_age_s: float = 3600.0,
    sessionless_evidence_max_age_s: float = 60.0,
    store: str | None = None,
    discard_store: bool = False,
) -> int:
    if (
        not 0 < heartbeat_s < lease_s
        or evidence_max_entries < MIN_MAX_ENTRIES
        or evidence_max_age_s <= 0
        or sessionless_evidence_max_age_s <= 0
    ):
        print(
            f"bastion: need 0 < --heartbeat-s < --lease-s, --evidence-max-entries >= {MIN_MAX_ENTRIES}"
            " and positive --evidence-max-age-s and --sessionless-evidence-max-age-s",
            file=sys.stderr,
        )
        return 2
    configure_logging(log_level)
    refusal = listen_address_refusal(host, port)
    if refusal is not None:
        say(f"bastion: {refusal}")
        return EXIT_START_REFUSED
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    demo_upstream: subprocess.Popen[str] | None = None
    try:
        if config is not None:
            snapshot = load_snapshot(config)
            refuse_anonymous_off_loopback(snapshot, host)
            token_note = None
        else:
            demo_upstream, tools_url = _start_demo_upstream(data_dir)
            token = _demo_token(data_dir)
            admin_token = _demo_token(data_dir, DEMO_ADMIN_TOKEN_FILE)
            snapshot = _demo_snapshot(data_dir, tools_url, hash_token(token), hash_token(admin_token))
            token_note = data_dir / DEMO_TOKEN_FILE
    except ConfigError as exc:
        say(f"bastion: {exc.message}")
        _stop(demo_upstream)
        return 2
    signal.signal(signal.SIGTERM, _TERMINATION)
    outcome = _Outcome()
    try:
        store_url = choose_store_url(store, os.environ, snapshot.store_url)
    except ConfigError as exc:
        say(f"bastion: {exc.message}")
        _stop(demo_upstream)
        return 2
    logger.info("store", extra={"store": describe_store(store_url, data_dir)})
    if not is_loopback(host) and not snapshot.gateway.allowed_hosts:
        # DNS-rebinding protection has no safe default off loopback: the operator names the hosts.
        say(f"bastion: --host {host} is not loopback; set gateway.allowed_hosts")
        _stop(demo_upstream)
        return 2
    try:
        options = RuntimeOptions(
            data_dir=data_dir,
            store_url=store_url,
            generation=generation,
            unsafe_no_audit=unsafe_no_audit,
            discard_store=discard_store,
            lease_s=lease_s,
            heartbeat_s=heartbeat_s,
            evidence_max_entries=evidence_max_entries,
            evidence_max_age_s=evidence_max_age_s,
            sessionless_evidence_max_age_s=sessionless_evidence_max_age_s,
        )
        anyio.run(
            _serve, snapshot, host, port, options, token_note, outcome, backend_options={"use_uvloop": True}
        )
    except KeyboardInterrupt:
        pass
    finally:
        _stop(demo_upstream)
    if outcome.refusal is not None:
        say(f"bastion: {outcome.refusal}")
        return EXIT_START_REFUSED
    if outcome.superseded:
        say("bastion: this worker was superseded by a newer epoch; it stopped")
        return EXIT_SUPERSEDED
    return 0


@dataclass
class _Outcome:
    """How serving ended: a refused start (its one line), or a superseded worker's exit."""

    refusal: str | None = None
    superseded: bool = False


async def _serve(
    snapshot: Snapshot,
    host: str,
    port: int,
    options: RuntimeOptions,
    token_note: Path | None,
    outcome: _Outcome | None = None,
) -> None:
    """Serve until stopped, or until this worker is superseded; ``outcome`` says which."""
    outcome = outcome if outcome is not None else _Outcome()
    app = create_app(snapshot, options)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            proxy_headers=False,  # no proxy is trusted by default: the peer address is the client
            server_header=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
            **uvicorn_options(front_door_limits(snapshot.gateway, snapshot.auth.mtls_trusted_proxies)),
        )
    )
    ended = anyio.Event()
    failed: list[SystemExit] = []

    async def serve() -> None:
        try:
            with _TERMINATION.serving():
                await server.serve()
        except SystemExit as exc:
            failed.append(exc)  # uvicorn exits when start-up failed; the reason is app.state.start_refusal
        finally:
            ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        while not server.started:
            if server.should_exit or ended.is_set():
                await ended.wait()
                refusal: str | None = getattr(app.state, "start_refusal", None)
                if refusal is None and failed:
                    refusal = "start failed: see the log"
                outcome.refusal = refusal
                return
            await anyio.sleep(0.02)
        bound = port
        for s in server.servers:
            for sock in s.sockets:
                bound = sock.getsockname()[1]
        url = f"http://{host}:{bound}/mcp"
        await tg.start(_reload_on_sighup, app)  # listening before READY: an early SIGHUP reloads
        settle_after_start()  # start-up's objects out of the collector's scans (heap.py)
        print(f"BASTION READY {url}{_not_ready_note(app)}", flush=True)
        if token_note is not None:
            print(_demo_banner(url, token_note), flush=True)
        tg.start_soon(_exit_when_superseded, app, server, outcome)
        await ended.wait()
        tg.cancel_scope.cancel()  # the SIGHUP listener ends with the server


async def _exit_when_superseded(app: Starlette, server: uvicorn.Server, outcome: _Outcome) -> None:
    """A superseded worker drains (uvicorn's graceful stop), stops its runtimes (shutdown) and exits."""
    membership = app.state.gateway.membership
    await membership.superseded_event.wait()
    outcome.superseded = True
    server.should_exit = True


class _Termination:
    """SIGTERM outside uvicorn's graceful stop: KeyboardInterrupt, so ``finally`` blocks still run.

    uvicorn stops gracefully on SIGTERM and then raises the signal again under the handler it
    found (this one): that second delivery only confirms the stop already done. The default
    action would end the process before the demo upstream is stopped (issue #11 point 16).
    """

    def __init__(self) -> None:
        self._serving = False

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        self._serving = True
        try:
            yield
        finally:
            self._serving = False

    def __call__(self, signum: int, frame: object) -> None:
        if not self._serving:
            raise KeyboardInterrupt


_TERMINATION = _Termination()


def _demo_banner(url: str, token_note: Path) -> str:
    """What the demo prints after READY: where its two tokens are, a first call, a first admin command.

    The commands name this installation's own interpreter and ``bastion`` script (a bare
    ``python`` outside the venv has no ``bastion`` module: issue #26 point 4).
    """
    admin_note = token_note.parent / DEMO_ADMIN_TOKEN_FILE
    base = url.removesuffix("/mcp")
    return (
        f"Demo agent token: {token_note} (send it as 'Authorization: Bearer <token>').\n"
        f"Demo admin token: {admin_note} (the admin API under {base}/admin/ and the admin commands).\n"
        f"Connect with the official Python SDK:\n"
        f"  {sys.executable} -m bastion.examples.connect --url {url} --token-file {token_note}\n"
        f"A first admin command (the replicas and upstream runtimes of this gateway):\n"
        f"  {_bastion_command()} workers --url {base} --admin-token-file {admin_note}"
    )


def _bastion_command() -> str:
    """How to run ``bastion`` here: the script beside this interpreter, else ``<python> -m bastion``."""
    script = Path(sys.executable).parent / "bastion"
    return str(script) if script.is_file() else f"{sys.executable} -m bastion.cli.main"


def _not_ready_note(app: Starlette) -> str:
    """`` not-ready=<name>,...`` for upstreams that are not connected yet ('' when all are)."""
    names = [h.name for h in app.state.gateway.fleet.health() if not h.connected]
    return f" not-ready={','.join(sorted(names))}" if names else ""


def _demo_token(data_dir: Path, name: str = DEMO_TOKEN_FILE) -> str:
    """The demo's token in ``data_dir/name`` (0600), made once and kept across restarts."""
    path = data_dir / name
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def _start_demo_upstream(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "BASTION_COUNTER_FILE": str(data_dir / "demo-counter.log")}
    process = subprocess.Popen(
        guarded_command(
            [sys.executable, "-m", "bastion.examples.tools_server", "--host", "127.0.0.1", "--port", "0"]
        ),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("LISTENING "):
        _stop(process)
        raise ConfigError("the demo tools server did not start")
    return process, line.split()[1]


def _demo_snapshot(data_dir: Path, tools_url: str, token_sha256: str, admin_token_sha256: str) -> Snapshot:
    data: dict[str, Any] = {
        "servers": {
            "notes": {
                "command": sys.executable,
                "args": ["-m", "bastion.examples.notes_server"],
                "env": {
                    "BASTION_NOTES_FILE": str(data_dir / "demo-notes.jsonl"),
                    "BASTION_COUNTER_FILE": str(data_dir / "demo-notes-counter.log"),
                },
            },
            "tools": {"url": tools_url},
        },
        "agents": {"demo": {"token_sha256": token_sha256}},
        "auth": {"admin_token_sha256": admin_token_sha256},
    }
    version = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    return snapshot_from_mapping(data, source=None, version=version)


def _stop(process: subprocess.Popen[str] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


async def _reload_on_sighup(
    app: Starlette, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """SIGHUP re-reads the configuration; an invalid file leaves the last valid snapshot in force."""
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            gateway = app.state.gateway
            try:
                state = await gateway.reload_policy()
                logger.warning("policy reloaded", extra={"policy_version": state.get("policy_version")})
            except ConfigError:
                pass  # policy/reload.py logged the refusal (once) with the version that stays
