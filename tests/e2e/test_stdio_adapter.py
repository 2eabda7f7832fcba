"""The stdio adapter end to end: the official SDK stdio client → ``bastion connect`` → Bastion → upstreams.

The client launches ``python -m bastion.cli.main connect`` exactly as a
desktop MCP client would launch a stdio server. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitResult

from tests.e2e.conftest import TOKENS, RunningGateway

pytestmark = pytest.mark.anyio

WAIT_S = 30


def adapter(running_gateway: RunningGateway, credential: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "bastion.cli.main",
            "connect",
            "--url",
            running_gateway.url,
            "--credential",
            str(credential),
        ],
    )


def write_credential(path: Path, token: str) -> None:
    """Replace the file atomically, as a renewal tool would."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(token + "\n")
    os.replace(temporary, path)


@pytest.fixture
def credential(tmp_path: Path) -> Path:
    path = tmp_path / "agent.token"
    write_credential(path, TOKENS["alice"])
    return path


class Seen:
    """Notifications the client received, by method."""

    def __init__(self) -> None:
        self.methods: list[str] = []
        self.changed = anyio.Event()

    async def __call__(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method is not None:
            self.methods.append(method)
            if method == "notifications/tools/list_changed":
                self.changed.set()


@contextlib.asynccontextmanager
async def through_adapter(
    running_gateway: RunningGateway,
    credential: Path,
    *,
    errlog: Path | None = None,
    mode: str = "legacy",
    **kwargs: Any,
) -> AsyncIterator[Client]:
    """An SDK client whose server is ``bastion connect``; its stderr to ``errlog`` if given."""
    params = adapter(running_gateway, credential)
    with contextlib.ExitStack() as files:
        if errlog is None:
            server: Any = params
        else:
            server = stdio_client(params, errlog=files.enter_context(errlog.open("w")))
        with anyio.fail_after(WAIT_S):
            async with Client(server, mode=mode, **kwargs) as client:
                yield client


def sessions_of(running_gateway: RunningGateway, agent: str) -> list[Any]:
    return [s for s in running_gateway.gateway.registry if s.agent == agent]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_lists_and_calls_tools_through_the_adapter(
    running_gateway: RunningGateway, credential: Path, mode: str
) -> None:
    """tools/list and tools/call reach both upstreams through the adapter, as the credential's agent;
    a client that probes for the sessionless era first falls back to initialize."""
    async with through_adapter(running_gateway, credential, mode=mode) as client:
        assert client.protocol_version == "2025-11-25"
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"notes__echo", "tools__echo", "tools__slow"} <= names
        for namespace in ("notes", "tools"):
            result = await client.call_tool(f"{namespace}__echo", {"text": f"via stdio {namespace}"})
            assert result.content[0].text == f"via stdio {namespace}"  # type: ignore[union-attr]
        assert [s.agent for s in running_gateway.gateway.registry] == ["alice"]
    with anyio.fail_after(WAIT_S):
        while len(running_gateway.gateway.registry):
            await anyio.sleep(0.02)  # the adapter ends its gateway session when the client leaves


@pytest.mark.parametrize("namespace", ["notes", "tools"])
async def test_progress_reaches_the_client(
    running_gateway: RunningGateway, credential: Path, namespace: str
) -> None:
    """Progress relayed on the answer's SSE stream arrives at the stdio client, in order, on its own call."""
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with through_adapter(running_gateway, credential) as client:
        result = await client.call_tool(
            f"{namespace}__slow", {"seconds": 0.2, "steps": 4}, progress_callback=on_progress
        )
    assert result.content[0].text == "done"  # type: ignore[union-attr]
    assert seen == [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)]


async def test_elicitation_is_relayed_both_ways(running_gateway: RunningGateway, credential: Path) -> None:
    """A server-to-client request on an answer stream reaches the stdio client; its answer goes back."""

    async def answer(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="accept", content={"answer": "forty-two"})

    async with through_adapter(running_gateway, credential, elicitation_callback=answer) as client:
        asked = await client.call_tool("tools__ask_user", {"question": "what?"})
    assert "forty-two" in asked.content[0].text  # type: ignore[union-attr]


async def test_cancellation_reaches_only_its_call(running_gateway: RunningGateway, credential: Path) -> None:
    """A client that abandons a slow call frees its in-flight slot at the gateway and keeps calling."""
    async with through_adapter(running_gateway, credential) as client:
        with anyio.move_on_after(0.5):
            await client.call_tool("tools__slow", {"seconds": 30, "steps": 2})
        with anyio.fail_after(WAIT_S):
            while any(s.in_flight for s in running_gateway.gateway.registry):
                await anyio.sleep(0.02)
        result = await client.call_tool("tools__echo", {"text": "after"})
    assert result.content[0].text == "after"  # type: ignore[union-attr]


async def test_gateway_session_ended_under_the_adapter_is_replaced(
    running_gateway: RunningGateway, credential: Path, tmp_path: Path
) -> None:
    """The gateway ends the transport session: the adapter re-initializes transparently, the client's
    next call works, and the client is told tools may have changed."""
    seen = Seen()
    errlog = tmp_path / "adapter.stderr"
    async with through_adapter(running_gateway, credential, errlog=errlog, message_handler=seen) as client:
        await client.call_tool("tools__echo", {"text": "before"})
        (first,) = sessions_of(running_gateway, "alice")
        await running_gateway.gateway.end_transport_session(first, "idle_expiry")

        result = await client.call_tool("notes__echo", {"text": "after"})
        assert result.content[0].text == "after"  # type: ignore[union-attr]
        with anyio.fail_after(WAIT_S):
            await seen.changed.wait()
        (second,) = sessions_of(running_gateway, "alice")
        assert second.id != first.id
        assert second.client_info == first.client_info  # the client's own initialize, replayed
        assert (await client.call_tool("tools__echo", {"text": "again"})).is_error is False
    assert TOKENS["alice"] not in errlog.read_text()


async def test_rewritten_credential_is_used_by_the_next_request(
    running_gateway: RunningGateway, credential: Path, tmp_path: Path
) -> None:
    """The credential file is re-read when it changes, without dropping the client; an unusable one is
    refused by the gateway, the next good one works, and no token ever reaches stderr."""
    seen = Seen()
    errlog = tmp_path / "adapter.stderr"
    async with through_adapter(running_gateway, credential, errlog=errlog, message_handler=seen) as client:
        await client.call_tool("tools__echo", {"text": "as alice"})

        write_credential(credential, "revoked-" + "r" * 40)
        with pytest.raises(MCPError) as refused:
            await client.call_tool("tools__echo", {"text": "refused"})
        assert refused.value.error.data["reason"] == "credential_invalid"

        # A different credential (here another agent): the old transport session is not its to use
        # (404), so the adapter opens one under the new credential and replays the call there.
        write_credential(credential, TOKENS["bob"])
        result = await client.call_tool("tools__echo", {"text": "as bob"})
        assert result.content[0].text == "as bob"  # type: ignore[union-attr]
        assert len(sessions_of(running_gateway, "bob")) == 1
        with anyio.fail_after(WAIT_S):
            await seen.changed.wait()
    log = errlog.read_text()
    assert TOKENS["alice"] not in log and TOKENS["bob"] not in log and "r" * 40 not in log


async def test_empty_credential_file_stops_before_connecting(tmp_path: Path) -> None:
    """``bastion connect`` with a credential file that holds no token exits 2 and says which file."""
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with anyio.fail_after(WAIT_S):
        done = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "bastion.cli.main",
                "connect",
                "--url",
                "http://127.0.0.1:9/mcp",
                "--credential",
                str(empty),
            ],
            check=False,
        )
    assert done.returncode == 2
    assert str(empty) in done.stderr.decode()
