"""The bundled example upstreams, driven as real subprocesses by the official SDK client.

Every server is exercised in both protocol eras: ``mode="legacy"`` (the
``initialize`` handshake, session era) and the client's default ``"auto"``,
which lands on the sessionless 2026-07-28 era against these servers.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from bastion.examples.counter import COUNTER_FILE_ENV, FileCounter
from bastion.examples.notes_file import NOTES_FILE_ENV

MODES = ["legacy", "auto"]
CALL_LIMIT_S = 20
START_LIMIT_S = 20
SHARED_TOOLS = {"echo", "slow", "increment", "count", "crash", "ask_user", "summarize"}
NOTES_TOOLS = SHARED_TOOLS | {"add_note", "list_notes", "roots", "grow"}
HTTP_TOOLS = SHARED_TOOLS | {"hang", "fail"}
TOOLS_SERVER = [sys.executable, "-m", "bastion.examples.tools_server", "--host", "127.0.0.1", "--port", "0"]
LISTENING = re.compile(r"^LISTENING (http://127\.0\.0\.1:(\d+)/mcp)$")


# --- client-side answers to the servers' questions --------------------------------


async def answer_elicitation(
    context: ClientRequestContext, params: types.ElicitRequestParams
) -> types.ElicitResult | types.ErrorData:
    return types.ElicitResult(action="accept", content={"answer": f"yes to {params.message}"})


async def answer_sampling(
    context: ClientRequestContext, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="a summary"), model="test-model"
    )


async def answer_roots(context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
    return types.ListRootsResult(roots=[types.Root(uri="file:///srv/project", name="project")])


def client_for(target: StdioServerParameters | str, mode: str) -> Client:
    return Client(
        target,
        mode=mode,
        read_timeout_seconds=CALL_LIMIT_S,
        elicitation_callback=answer_elicitation,
        sampling_callback=answer_sampling,
        list_roots_callback=answer_roots,
    )


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@dataclass
class ProgressLog:
    events: list[tuple[float, float | None, str | None]]

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.events.append((progress, total, message))


# --- launching the servers ---------------------------------------------------------


def notes_params(tmp_path: Path, *, exit_status_file: Path | None = None) -> StdioServerParameters:
    env = {COUNTER_FILE_ENV: str(tmp_path / "counter"), NOTES_FILE_ENV: str(tmp_path / "notes.jsonl")}
    if exit_status_file is None:
        return StdioServerParameters(
            command=sys.executable, args=["-m", "bastion.examples.notes_server"], env=env
        )
    # A parent that records the server's exit status, since stdio_client keeps its process to itself.
    recorder = (
        "import subprocess, sys; "
        "status = subprocess.call([sys.executable, '-m', 'bastion.examples.notes_server']); "
        "open(sys.argv[1], 'w').write(str(status))"
    )
    return StdioServerParameters(
        command=sys.executable, args=["-c", recorder, str(exit_status_file)], env=env
    )


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def tools_server(tmp_path: Path, *extra_args: str) -> Iterator[RunningServer]:
    env = dict(os.environ, **{COUNTER_FILE_ENV: str(tmp_path / "counter")})
    process = subprocess.Popen(
        [*TOOLS_SERVER, *extra_args],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], START_LIMIT_S)
        assert ready, "tools_server did not announce itself in time"
        line = process.stdout.readline().decode().strip()
        match = LISTENING.match(line)
        assert match is not None, f"unexpected first line {line!r}"
        assert int(match.group(2)) > 0
        yield RunningServer(url=match.group(1), process=process)
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


def wait_for_file(path: Path, limit_s: float) -> str:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if path.exists() and (content := path.read_text()):
            return content
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {limit_s}s")


# --- the counter ------------------------------------------------------------------


def test_counter_counts_lines_and_starts_at_zero(tmp_path: Path) -> None:
    """A missing counter file counts 0; each increment appends one line and returns the new count."""
    counter = FileCounter(tmp_path / "counter")
    assert counter.count() == 0
    assert [counter.increment() for _ in range(3)] == [1, 2, 3]
    assert counter.count() == 3
    assert (tmp_path / "counter").read_bytes().count(b"\n") == 3


# --- notes_server over stdio ------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_notes_server_serves_its_tools(tmp_path: Path, mode: str) -> None:
    """The stdio server lists its tools with their hints and answers echo, notes and the counter."""
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path), mode) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(listed) == NOTES_TOOLS
            for name in ("echo", "list_notes", "count"):
                annotations = listed[name].annotations
                assert annotations is not None and annotations.read_only_hint is True
            assert set(listed["echo"].input_schema["properties"]) == {"text"}
            assert set(listed["ask_user"].input_schema["properties"]) == {"question"}

            assert text_of(await client.call_tool("echo", {"text": "hello"})) == "hello"
            assert text_of(await client.call_tool("add_note", {"text": "first"})) == "1"
            assert text_of(await client.call_tool("add_note", {"text": "second"})) == "2"
            assert text_of(await client.call_tool("list_notes")) == "first\nsecond"
            assert [text_of(await client.call_tool("increment")) for _ in range(3)] == ["1", "2", "3"]
            assert text_of(await client.call_tool("count")) == "3"
    assert FileCounter(tmp_path / "counter").count() == 3


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_notes_server_reports_progress(tmp_path: Path, mode: str) -> None:
    """slow(seconds, steps) sends one progress notification per step, then answers done."""
    progress = ProgressLog([])
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path), mode) as client:
            result = await client.call_tool("slow", {"seconds": 0.1, "steps": 3}, progress_callback=progress)
    assert text_of(result) == "done"
    assert [(p, t) for p, t, _ in progress.events] == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_notes_server_asks_the_client(tmp_path: Path, mode: str) -> None:
    """ask_user elicits, summarize samples and roots lists roots, through the client's callbacks."""
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path), mode) as client:
            asked = await client.call_tool("ask_user", {"question": "proceed?"})
            summarized = await client.call_tool("summarize", {"text": "a long text"})
            rooted = await client.call_tool("roots")
    assert text_of(asked) == "yes to proceed?"
    assert text_of(summarized) == "a summary"
    assert text_of(rooted) == "file:///srv/project"


@pytest.mark.anyio
async def test_notes_server_counter_survives_restart(tmp_path: Path) -> None:
    """The counter file keeps counting across two server processes."""
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path), "legacy") as client:
            await client.call_tool("increment")
        async with client_for(notes_params(tmp_path), "auto") as client:
            assert text_of(await client.call_tool("increment")) == "2"
            assert text_of(await client.call_tool("count")) == "2"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_notes_server_crash_kills_the_process(tmp_path: Path, mode: str) -> None:
    """crash() ends the server with exit status 1 mid-call, and the call fails."""
    status_file = tmp_path / "exit-status"
    with anyio.fail_after(CALL_LIMIT_S):
        async with client_for(notes_params(tmp_path, exit_status_file=status_file), mode) as client:
            with pytest.raises(MCPError):
                await client.call_tool("crash")
    assert wait_for_file(status_file, CALL_LIMIT_S) == "1"


# --- tools_server over Streamable HTTP --------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
@pytest.mark.parametrize("mode", MODES)
async def test_tools_server_serves_its_tools(tmp_path: Path, mode: str, json_response: bool) -> None:
    """The HTTP server serves both eras, SSE or JSON: echo, fail, the counter and slow."""
    extra = ["--json-response"] if json_response else []
    progress = ProgressLog([])
    with tools_server(tmp_path, *extra) as server, anyio.fail_after(CALL_LIMIT_S):
        async with client_for(server.url, mode) as client:
            expected_version = "2025-11-25" if mode == "legacy" else "2026-07-28"
            assert client.protocol_version == expected_version
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert listed == HTTP_TOOLS

            assert text_of(await client.call_tool("echo", {"text": "héllo"})) == "héllo"
            failed = await client.call_tool("fail")
            assert failed.is_error is True
            assert [text_of(await client.call_tool("increment")) for _ in range(2)] == ["1", "2"]
            assert text_of(await client.call_tool("count")) == "2"
            slow = await client.call_tool("slow", {"seconds": 0.1, "steps": 2}, progress_callback=progress)
            assert text_of(slow) == "done"
    assert FileCounter(tmp_path / "counter").count() == 2
    if not json_response:
        # A JSON answer has no stream for progress to ride on, so only SSE is checked.
        assert [(p, t) for p, t, _ in progress.events] == [(1, 2), (2, 2)]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_tools_server_asks_the_client(tmp_path: Path, mode: str) -> None:
    """Over SSE, ask_user elicits and summarize samples through the client's callbacks."""
    with tools_server(tmp_path) as server, anyio.fail_after(CALL_LIMIT_S):
        async with client_for(server.url, mode) as client:
            assert text_of(await client.call_tool("ask_user", {"question": "ok?"})) == "yes to ok?"
            assert text_of(await client.call_tool("summarize", {"text": "words"})) == "a summary"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_tools_server_hang_never_answers(tmp_path: Path, mode: str) -> None:
    """hang() never answers, so the client's own read timeout ends the call."""
    with tools_server(tmp_path) as server, anyio.fail_after(CALL_LIMIT_S):
        async with client_for(server.url, mode) as client:
            with pytest.raises(MCPError, match="timed out"):
                await client.call_tool("hang", read_timeout_seconds=0.3)
            assert text_of(await client.call_tool("echo", {"text": "still here"})) == "still here"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_tools_server_crash_kills_the_process(tmp_path: Path, mode: str) -> None:
    """crash() ends the HTTP server with exit status 1 mid-call, and the client sees a failure."""
    with tools_server(tmp_path) as server:
        failures: list[BaseException] = []
        with anyio.fail_after(CALL_LIMIT_S):
            # Session era: the call raises MCPError. Sessionless era: the SDK client's task
            # group raises the transport's disconnect error out of the client context instead.
            try:
                async with client_for(server.url, mode) as client:
                    await client.call_tool("crash")
            except (MCPError, ExceptionGroup) as failure:
                failures.append(failure)
        assert failures, "the crash call did not fail"
        assert server.process.wait(timeout=CALL_LIMIT_S) == 1
