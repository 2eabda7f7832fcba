"""The first hour with Bastion, through the real entry points (issue #26 points 1 to 9).

Each test runs the installed ``bastion`` script (or the real ``make serve``) as a
subprocess, as a newcomer or an operator would, and reads what they would read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bastion import __version__ as bastion_version
from bastion.cli.serve import EXIT_START_REFUSED
from bastion.crypto.keys import Keyring

BASTION = str(Path(sys.executable).parent / "bastion")
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bastion(*args: str, stdin: str = "", timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASTION, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


class Serve:
    """One ``bastion serve`` (or ``make serve``) process; stdout read up to the READY line and after."""

    def __init__(self, argv: list[str], cwd: Path | None = None) -> None:
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # stop() signals the group: make and the gateway under it
        )
        self.lines: list[str] = []
        self.log: str | None = None

    @classmethod
    def bastion(cls, *args: str) -> Serve:
        return cls([BASTION, "serve", "--port", "0", *args])

    @classmethod
    def make(cls, data_dir: Path) -> Serve:
        """The README's ``make serve``, on a free port and its own data directory (through ARGS)."""
        args = f"--port {free_port()} --data-dir {data_dir}"
        return cls(["make", "--no-print-directory", "serve", f"ARGS={args}"], cwd=REPO)

    def ready_line(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            assert line, f"serve exited before READY: {self.stop()}"
            self.lines.append(line)
            if line.startswith("BASTION READY "):
                return line.strip()
        raise AssertionError("no READY line")

    def banner(self, count: int) -> list[str]:
        """The ``count`` lines printed after READY."""
        assert self.process.stdout is not None
        return [self.process.stdout.readline().rstrip("\n") for _ in range(count)]

    def url(self) -> str:
        return self.ready_line().split()[2]

    def stop(self, signal_number: int | None = None) -> str:
        """Stop it (SIGTERM by default, then kill if it lingers); its stderr."""
        if self.log is not None:
            return self.log
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal_number or signal.SIGTERM)
            try:
                self.process.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=WAIT_S)
        assert self.process.stderr is not None
        self.log = self.process.stderr.read()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        return self.log


@pytest.fixture
def serving() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for serve in started:
        serve.stop()


# ---------------------------------------------------------------- point 1


def test_a_missing_stdio_command_is_named_at_once_not_after_the_initialize_timeout(
    tmp_path: Path, serving: list[Serve]
) -> None:
    config = tmp_path / "gateway.toml"
    admin = "first-hour-admin-token"
    digest = hashlib.sha256(admin.encode()).hexdigest()
    config.write_text(
        f'[servers.ghost]\ncommand = "/no/such/binary"\n\n[auth]\nadmin_token_sha256 = "{digest}"\n'
    )
    started = time.monotonic()
    serve = Serve.bastion("--config", str(config), "--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    ready = serve.ready_line()
    took = time.monotonic() - started
    assert ready.endswith("not-ready=ghost"), ready
    assert took < 15, f"READY after {took:.1f} s: the 30 s initialize timeout was waited"
    base = ready.split()[2].removesuffix("/mcp")
    detail = httpx.get(base + "/readyz", headers={"Authorization": f"Bearer {admin}"}, timeout=10).json()
    (ghost,) = detail["upstreams"]
    assert ghost["name"] == "ghost" and not ghost["connected"]
    assert "/no/such/binary" in ghost["detail"] and "exited" in ghost["detail"], ghost
    log = serve.stop()
    assert "upstream ghost (/no/such/binary) exited before answering initialize" in log, log
    assert "not ready at start" in log


# ---------------------------------------------------------------- point 2


def test_a_port_in_use_is_refused_first_naming_the_address(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = bastion("serve", "--port", str(port), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == EXIT_START_REFUSED, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"bastion: start refused: listen address 127.0.0.1:{port} is already in use; choose another --port"
    ]
    assert not (tmp_path / "data" / "demo-agent.token").exists()  # refused before anything started


# ---------------------------------------------------------------- points 3 and 4


def test_make_serve_banner_commands_run_as_printed_a_governed_call_and_an_admin_command(
    tmp_path: Path, serving: list[Serve]
) -> None:
    """The demo writes an admin token too (0600) and its banner's two commands work, copied literally."""
    data = tmp_path / "data"
    serve = Serve.make(data)
    serving.append(serve)
    url = serve.url()
    banner = serve.banner(6)
    admin_file = data / "demo-admin.token"
    assert banner[1].startswith(f"Demo admin token: {admin_file} "), banner
    assert stat.S_IMODE(admin_file.stat().st_mode) == 0o600
    assert admin_file.read_text().strip() != (data / "demo-agent.token").read_text().strip()
    assert [line.rstrip() for line in banner] == _readme_banner(url, data)[1:], "README shows another banner"
    connect, admin = shlex.split(banner[3]), shlex.split(banner[5])
    assert connect[0] != "python" and Path(connect[0]).is_file(), banner[3]
    assert url in connect
    called = subprocess.run(connect, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert called.returncode == 0, called.stderr
    assert "tools__echo -> hello through Bastion" in called.stdout
    listed = subprocess.run(admin, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert listed.returncode == 0, listed.stderr
    assert "gateway-0" in listed.stdout and "upstream-notes" in listed.stdout, listed.stdout


def _readme_banner(url: str, data: Path) -> list[str]:
    """The banner README.md shows, with this run's URL, data directory and installation put in."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("```text\nBASTION READY ", 1)[1].split("```", 1)[0]
    text = ("BASTION READY " + block).replace("http://127.0.0.1:8765", url.removesuffix("/mcp"))
    text = text.replace(".bastion/", f"{data}/").replace("/path/to/bastion", str(REPO))
    return text.rstrip("\n").splitlines()


def test_admin_disabled_names_the_setting_and_how_to_fill_it(tmp_path: Path, serving: list[Serve]) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[servers.tools]\nurl = "http://127.0.0.1:9/mcp"\n')
    token = tmp_path / "admin.token"
    token.write_text("some-admin-token\n")
    serve = Serve.bastion("--config", str(config), "--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    base = serve.url().removesuffix("/mcp")
    result = bastion("workers", "--url", base, "--admin-token-file", str(token))
    assert result.returncode == 1
    assert "admin_disabled" in result.stderr
    assert "[auth] admin_token_sha256" in result.stderr and "bastion hash-token" in result.stderr


def test_the_connect_example_without_a_gateway_says_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    token = tmp_path / "agent.token"
    token.write_text("t\n")
    url = f"http://127.0.0.1:{free_port()}/mcp"
    argv = [sys.executable, "-m", "bastion.examples.connect", "--url", url, "--token-file", str(token)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "make serve" in lines[0], result.stderr
    missing = [*argv[:-1], str(tmp_path / "missing.token")]
    result = subprocess.run(missing, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "missing.token" in result.stderr


# ---------------------------------------------------------------- points 5 and 6

_TOKEN = "first-hour-agent-token"
_GRANTED_CONFIG = f"""
[servers.notes]
command = "{sys.executable}"
args = ["-m", "bastion.examples.notes_server"]

[agents.a]
token_sha256 = "{hashlib.sha256(_TOKEN.encode()).hexdigest()}"

[[grants]]
name = "echo-only"
agent = "a"
servers = ["notes"]
tools = [{{tools}}]
"""


def test_a_grant_spelling_the_exposed_tool_name_is_refused_naming_the_upstream_name(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(_GRANTED_CONFIG.replace("{tools}", '"echo", "notes__add_note"'))
    checked = bastion("check-config", str(config))
    assert checked.returncode == 2
    assert "grant echo-only: tools names 'notes__add_note', the name clients see" in checked.stderr
    assert "'add_note'" in checked.stderr
    served = bastion("serve", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "d"))
    assert served.returncode == 2 and checked.stderr.strip() in served.stderr


def test_an_ungranted_tool_answers_what_the_configuration_docs_say(
    tmp_path: Path, serving: list[Serve]
) -> None:
    """-32602 ``unknown_tool`` on the wire (hidden is unknown), as docs/configuration.md now says."""
    config = tmp_path / "gateway.toml"
    config.write_text(_GRANTED_CONFIG.replace("{tools}", '"echo"'))
    serve = Serve.bastion("--config", str(config), "--data-dir", str(tmp_path / "d"))
    serving.append(serve)
    url = serve.url()

    async def call() -> MCPError:
        with anyio.fail_after(WAIT_S):
            return await call_unbounded()

    async def call_unbounded() -> MCPError:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {_TOKEN}"}, timeout=30) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            echoed = await client.call_tool("notes__echo", {"text": "granted"})
            assert not echoed.is_error
            with pytest.raises(MCPError) as caught:
                await client.session.call_tool("notes__add_note", {"text": "not granted"})
            return caught.value

    refused = anyio.run(call)
    assert refused.error.code == -32602
    assert refused.error.data["reason"] == "unknown_tool"
    docs = " ".join((REPO / "docs" / "configuration.md").read_text().split())
    assert (
        "No covering grant: refused, and answered exactly as a tool that does not exist:"
        " JSON-RPC error `-32602`" in docs
    )
    assert "`unknown_tool`" in docs


# ---------------------------------------------------------------- point 7


def test_bastion_version() -> None:
    result = bastion("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"bastion {bastion_version}"


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``bastion public-key | head``: the reader is gone before the write; no BrokenPipe traceback."""
    Keyring.open(tmp_path)
    for args in (
        ["public-key", "--data-dir", str(tmp_path)],
        ["--help"],
        ["public-key", "--jwk", "--data-dir", str(tmp_path)],
    ):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            result = subprocess.run(
                [BASTION, *args],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=WAIT_S,
                check=False,
            )
        finally:
            os.close(write_end)
        assert result.stderr == "", (args, result.stderr)


def test_hash_token_refuses_an_empty_token() -> None:
    result = bastion("hash-token", stdin="")
    assert result.returncode == 2 and result.stdout == ""
    assert "no token" in result.stderr and "bastion hash-token <" in result.stderr
    assert bastion("hash-token", stdin="\n").returncode == 2
    ok = bastion("hash-token", stdin="abc\n")
    assert ok.returncode == 0 and ok.stdout.strip() == hashlib.sha256(b"abc").hexdigest()


def test_every_serve_option_has_help_text() -> None:
    result = subprocess.run(
        [BASTION, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert result.returncode == 0
    lines = result.stdout.split("options:", 1)[1].splitlines()[1:]
    options = [i for i, line in enumerate(lines) if line.startswith("  -")]
    assert len(options) >= 13
    for i in options:
        spec_and_help = lines[i].strip().split("  ", 1)
        continued = (
            i + 1 < len(lines) and lines[i + 1].startswith("   ") and not lines[i + 1].startswith("  -")
        )
        assert len(spec_and_help) == 2 or continued, f"no help text: {lines[i].strip()}"


# ---------------------------------------------------------------- point 8


def _metrics(base: str) -> str:
    return httpx.get(base + "/metrics", timeout=10).text


def _log_lines(log: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def test_a_clean_stop_of_the_demo_logs_no_failure_and_no_ansi(tmp_path: Path, serving: list[Serve]) -> None:
    serve = Serve.bastion("--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    serve.ready_line()
    log = serve.stop()
    assert serve.process.returncode == 0, log
    lines = _log_lines(log)
    assert any(line["msg"] == "upstream runtime stopped" for line in lines), log
    assert "upstream runtime failed" not in log
    assert all("color_message" not in line for line in lines), log
    assert "\\u001b" not in log and "\x1b" not in log


def test_a_refused_sighup_reload_is_logged_once(tmp_path: Path, serving: list[Serve]) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[servers.tools]\nurl = "http://127.0.0.1:9/mcp"\n')
    serve = Serve.bastion("--config", str(config), "--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    base = serve.url().removesuffix("/mcp")
    config.write_text("not [ toml\n")
    serve.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S
    while "bastion_policy_reload_failing 1.0" not in _metrics(base):  # recorded, and so logged, by now
        assert time.monotonic() < deadline, "the SIGHUP reload was never tried"
        time.sleep(0.05)
    time.sleep(0.5)  # a second log line, if any, is written right after the first
    refusals = [line for line in _log_lines(serve.stop()) if "reload refused" in str(line["msg"])]
    assert len(refusals) == 1, refusals


# ---------------------------------------------------------------- point 9


def test_sessions_list_shows_live_sessions_across_replicas_with_the_reference_admin_takes(
    tmp_path: Path, serving: list[Serve]
) -> None:
    """A session opened at replica A is listed by replica B; its REF opens /admin/sessions/{ref}/..."""
    data = tmp_path / "data"
    first = Serve.bastion("--data-dir", str(data))
    serving.append(first)
    url_a = first.url()
    second = Serve.bastion("--data-dir", str(data), "--generation", "gateway-1")
    serving.append(second)
    base_b = second.url().removesuffix("/mcp")
    admin_file = data / "demo-admin.token"
    admin = {"Authorization": f"Bearer {admin_file.read_text().strip()}"}
    token = (data / "demo-agent.token").read_text().strip()
    listing = ["sessions", "list", "--url", base_b, "--admin-token-file", str(admin_file)]

    async def while_a_session_is_open() -> tuple[subprocess.CompletedProcess[str], ...]:
        with anyio.fail_after(WAIT_S):
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
                Client(streamable_http_client(url_a, http_client=http), mode="legacy") as client,
            ):
                await client.list_tools()
                await client.call_tool("notes__echo", {"text": "listed"})
                table = await anyio.to_thread.run_sync(lambda: bastion(*listing))
                as_json = await anyio.to_thread.run_sync(lambda: bastion(*listing, "--json"))
                workers = await anyio.to_thread.run_sync(
                    lambda: bastion(
                        "workers", "--url", base_b, "--admin-token-file", str(admin_file), "--json"
                    )
                )
                ref = json.loads(as_json.stdout)["sessions"][0]["transport_session_ref"]
                async with httpx2.AsyncClient(headers=admin, timeout=10) as http:
                    attachments = await http.get(f"{base_b}/admin/sessions/{ref}/attachments")
                assert attachments.status_code == 200, attachments.text
                return table, as_json, workers

    table, as_json, workers = anyio.run(while_a_session_is_open)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["REF", "AGENT", "PROTOCOL"]
    sessions = json.loads(as_json.stdout)["sessions"]
    assert len(sessions) == 1, sessions
    listed = sessions[0]
    ref = listed["transport_session_ref"]
    assert ref.startswith("ts_") and ref in table.stdout
    assert listed["agent"] == "demo" and listed["protocol_version"].startswith("20")
    assert {r["namespace"] for r in listed["ownership_records"]} == {"notes", "tools"}
    notes_owner = next(r["worker_id"] for r in listed["ownership_records"] if r["namespace"] == "notes")
    by_id = {w["worker_id"]: w for w in json.loads(workers.stdout)["workers"]}
    assert by_id[notes_owner]["owning_sessions"] == [ref]  # the attachment record proves it
    after = bastion(*listing, "--json")  # the session closed (DELETE): no longer listed
    assert json.loads(after.stdout)["sessions"] == []
