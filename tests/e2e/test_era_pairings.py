"""Every client-visible feature survives every pairing of client era and upstream era (issue #8).

The official Python client in each era (``legacy``: session era; ``auto``:
the 2026-07-28 sessionless era, which Bastion serves) calls a real SDK
server (``tests/e2e/era_upstream.py``, one process serving both eras)
through Bastion, with the upstream's era pinned in the configuration:
``session`` or ``sessionless``. ``auto`` lets Bastion see both eras on the
upstream and pick the path that loses nothing.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import (
    CreateMessageResult,
    ElicitResult,
    ListRootsResult,
    LoggingMessageNotificationParams,
    Root,
    TextContent,
)

from tests.e2e.conftest import TOKENS
from tests.e2e.era_support import era_upstream_url, gateway_for

pytestmark = pytest.mark.anyio

__all__ = ["era_upstream_url"]  # the fixture, imported for pytest
PAIRINGS = [
    pytest.param("legacy", "session", id="session-session"),
    pytest.param("legacy", "sessionless", id="session-sessionless"),
    pytest.param("auto", "session", id="sessionless-session"),
    pytest.param("auto", "sessionless", id="sessionless-sessionless"),
]


async def answer_elicitation(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"answer": "forty-two"})


async def answer_sampling(context: Any, params: Any) -> CreateMessageResult:
    return CreateMessageResult(
        role="assistant", content=TextContent(type="text", text="a summary"), model="m", stop_reason="endTurn"
    )


async def answer_roots(context: Any) -> ListRootsResult:
    return ListRootsResult(roots=[Root(uri="file:///work/project")])  # type: ignore[arg-type]


async def set_level(client: Any, level: str) -> None:
    # logging/setLevel is the session era's way (deprecated by 2026-07-28, hence the warning).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await client.set_logging_level(level)


def text_of(result: Any) -> str:
    return str(result.content[0].text)


@pytest.mark.parametrize(("mode", "upstream_era"), PAIRINGS)
async def test_progress_reaches_the_caller(
    tmp_path: Path, era_upstream_url: str, mode: str, upstream_era: str
) -> None:
    """Progress from the upstream reaches the calling client, in order, in every pairing."""
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(mode=mode) as client,
    ):
        result = await client.call_tool(
            "up__slow", {"seconds": 0.1, "steps": 3}, progress_callback=on_progress
        )
    assert text_of(result) == "done"
    assert seen == [1, 2, 3]


@pytest.mark.parametrize("level", ["warning", None])
@pytest.mark.parametrize(("mode", "upstream_era"), PAIRINGS)
async def test_logging_arrives_at_the_clients_level(
    tmp_path: Path, era_upstream_url: str, mode: str, upstream_era: str, level: str | None
) -> None:
    """Logs reach the caller at and above its level; with none set, its era's default (all, or none)."""
    levels: list[str] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        levels.append(params.level)

    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(mode=mode, logging_callback=on_log, log_level=level) as client,
    ):
        if mode == "legacy" and level is not None:
            await set_level(client, level)
        result = await client.call_tool("up__chatty", {})
    assert text_of(result) == "logged"
    if level is not None:
        assert levels == ["warning", "error"]
    else:
        assert levels == (["debug", "info", "warning", "error"] if mode == "legacy" else [])


@pytest.mark.parametrize(("mode", "upstream_era"), PAIRINGS)
async def test_sampling_elicitation_and_roots_reach_the_caller(
    tmp_path: Path, era_upstream_url: str, mode: str, upstream_era: str
) -> None:
    """Sampling, elicitation and roots asked by the upstream are answered by the calling client."""
    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(
            mode=mode,
            elicitation_callback=answer_elicitation,
            sampling_callback=answer_sampling,
            list_roots_callback=answer_roots,
        ) as client,
    ):
        with anyio.fail_after(30):
            asked = await client.call_tool("up__ask_user", {"question": "what?"})
            summary = await client.call_tool("up__summarize", {"text": "long text"})
            roots = await client.call_tool("up__where", {})
    assert text_of(asked) == "forty-two"
    assert text_of(summary) == "a summary"
    assert text_of(roots) == "file:///work/project"


@pytest.mark.parametrize(
    ("mode", "upstream_era"),
    [
        pytest.param("legacy", "sessionless", id="session-sessionless"),
        pytest.param("auto", "sessionless", id="sessionless-sessionless"),
        pytest.param("auto", "auto", id="sessionless-both"),
    ],
)
async def test_input_required_style_tool_is_served(
    tmp_path: Path, era_upstream_url: str, mode: str, upstream_era: str
) -> None:
    """A tool written the 2026 way (returns input_required) works for both client eras.

    The SDK serves such a tool only on its 2026 path (on a session-era connection it is an
    invalid result, for a direct client as through Bastion), so the upstream speaks 2026 here;
    a session-era client is asked over its back channel by Bastion, round after round.
    """
    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(mode=mode, elicitation_callback=answer_elicitation) as client,
    ):
        with anyio.fail_after(30):
            result = await client.call_tool("up__confirm", {})
    assert text_of(result) == "confirmed:forty-two:confirm-1"


@pytest.mark.parametrize(("mode", "upstream_era"), PAIRINGS)
async def test_cancelled_call_frees_the_gateway(
    tmp_path: Path, era_upstream_url: str, mode: str, upstream_era: str
) -> None:
    """A client that abandons a call that never ends frees it at the gateway and keeps calling."""
    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(mode=mode) as client,
    ):
        with anyio.move_on_after(0.5) as abandoned:
            await client.call_tool("up__hang", {})
        with anyio.fail_after(10):
            while any(s.in_flight for s in gateway.gateway.registry):
                await anyio.sleep(0.02)
        after = await client.call_tool("up__echo", {"text": "after"})
    assert abandoned.cancelled_caught
    assert text_of(after) == "after"


@pytest.mark.parametrize(("mode", "upstream_era"), PAIRINGS)
async def test_x_mcp_header_tool_is_callable(
    tmp_path: Path, era_upstream_url: str, mode: str, upstream_era: str
) -> None:
    """A tool with an x-mcp-header parameter is callable in every pairing (Mcp-Param-* derived upstream)."""
    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(mode=mode) as client,
    ):
        result = await client.call_tool("up__regional", {"region": "eu-west", "text": "hi"})
    assert text_of(result) == "eu-west:hi"


def _modern_call(
    name: str, arguments: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": name,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    sent = {
        "authorization": f"Bearer {TOKENS['alice']}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": name,
        **headers,
    }
    return body, sent


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({"mcp-param-region": "eu-west"}, 200, id="matching"),
        pytest.param({"mcp-param-region": "us-east"}, 400, id="different"),
        pytest.param({}, 400, id="missing"),
    ],
)
async def test_mcp_param_headers_are_checked_at_the_front(
    tmp_path: Path, era_upstream_url: str, headers: dict[str, str], status: int
) -> None:
    """A 2026 client's Mcp-Param-* header must match its argument, else -32020 with HTTP 400."""
    async with gateway_for(tmp_path, era_upstream_url, "sessionless") as gateway:
        body, sent = _modern_call("up__regional", {"region": "eu-west", "text": "hi"}, headers)
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(gateway.url, json=body, headers=sent)
    assert response.status_code == status
    if status == 400:
        assert response.json()["error"]["code"] == -32020
    else:
        assert "eu-west:hi" in response.text


@pytest.mark.parametrize("upstream_era", ["sessionless", "auto"])
async def test_upstream_list_changed_reaches_a_session_era_client(
    tmp_path: Path, era_upstream_url: str, upstream_era: str
) -> None:
    """A tool registered at run time on a 2026 upstream reaches a session-era client (subscriptions/listen).

    (A session-era upstream announces on each session's own GET stream; Bastion watches only its
    catalog session's, so that case is listed in docs/architecture.md, not covered here.)
    """
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()

    name = f"fresh_{upstream_era}"
    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(mode="legacy", message_handler=on_message) as client,
    ):
        await client.list_tools()
        await client.call_tool("up__grow", {"name": name})
        with anyio.fail_after(15):
            await changed.wait()
        result = await client.call_tool(f"up__{name}", {"text": "hi"})
    assert text_of(result) == f"{name}: hi"


@pytest.mark.parametrize("upstream_era", ["sessionless", "auto"])
async def test_upstream_list_changed_reaches_a_sessionless_client(
    tmp_path: Path, era_upstream_url: str, upstream_era: str
) -> None:
    """A tool registered at run time on a 2026 upstream reaches a 2026 client on its subscriptions/listen."""
    name = f"fresh2026_{upstream_era}"
    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        gateway.client(mode="auto") as client,
        gateway.client(mode="auto") as other,
    ):
        await client.list_tools()
        async with client.listen(tools_list_changed=True) as subscription:
            await other.call_tool("up__grow", {"name": name})
            with anyio.fail_after(15):
                async for _event in subscription:
                    break
        result = await client.call_tool(f"up__{name}", {"text": "hi"})
    assert text_of(result) == f"{name}: hi"


async def test_dual_era_upstream_gives_a_session_era_client_its_own_upstream_session(
    tmp_path: Path, era_upstream_url: str
) -> None:
    """On an upstream of both eras, a session-era client gets its own upstream session (setLevel too)."""
    levels: list[str] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        levels.append(params.level)

    async with (
        gateway_for(tmp_path, era_upstream_url, "auto") as gateway,
        gateway.client(
            mode="legacy", logging_callback=on_log, elicitation_callback=answer_elicitation
        ) as client,
    ):
        await set_level(client, "error")
        await client.call_tool("up__chatty", {})
        asked = await client.call_tool("up__ask_user", {"question": "what?"})
        (transport_session,) = list(gateway.gateway.registry)
        upstream_sessions = transport_session.upstream_sessions.servers()
    assert gateway.gateway.fleet.upstreams["up"].health().era == "sessionless"
    assert upstream_sessions == ["up"]
    assert levels == ["error"]
    assert text_of(asked) == "forty-two"


def _reply(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        lines = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(lines[-1]))
    return dict(response.json())


async def _sessionless_call(
    http: httpx.AsyncClient, url: str, agent: str, tool: str, arguments: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    body, sent = _modern_call(tool, arguments, {})
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = {"elicitation": {}}
    body["params"].update(extra)
    sent["authorization"] = f"Bearer {TOKENS[agent]}"
    return _reply(await http.post(url, json=body, headers=sent))


async def test_a_parked_round_resumes_once_and_only_for_its_agent(
    tmp_path: Path, era_upstream_url: str
) -> None:
    """A requestState of Bastion's rounds is refused to another agent and once used (-32036)."""
    arguments = {"question": "what?"}
    async with (
        gateway_for(tmp_path, era_upstream_url, "session") as gateway,
        httpx.AsyncClient(timeout=30) as http,
    ):

        async def call(agent: str, extra: dict[str, Any]) -> dict[str, Any]:
            return await _sessionless_call(http, gateway.url, agent, "up__ask_user", arguments, extra)

        first = (await call("alice", {}))["result"]
        assert first["resultType"] == "input_required"
        (key,) = first["inputRequests"]
        assert first["inputRequests"][key]["method"] == "elicitation/create"
        answers = {key: {"action": "accept", "content": {"answer": "forty-two"}}}
        retry = {"requestState": first["requestState"], "inputResponses": answers}
        by_bob = await call("bob", retry)
        by_alice = await call("alice", retry)
        again = await call("alice", retry)
    assert by_bob["error"]["code"] == -32036
    assert by_bob["error"]["data"]["reason"] == "input_round_unknown"
    assert by_alice["result"]["content"][0]["text"] == "forty-two"
    assert again["error"]["code"] == -32036


@pytest.mark.parametrize("upstream_era", ["session", "sessionless"])
async def test_an_execution_spans_its_input_rounds_and_is_then_terminal(
    tmp_path: Path, era_upstream_url: str, upstream_era: str
) -> None:
    """Under one execution_id the rounds of an input-required call are one execution; a new call replays."""
    cmcp = {"_cmcp": {"execution_id": f"ask-{upstream_era}"}}
    arguments = {"question": "what?"}
    async with (
        gateway_for(tmp_path, era_upstream_url, upstream_era) as gateway,
        httpx.AsyncClient(timeout=30) as http,
    ):

        async def call(extra: dict[str, Any]) -> dict[str, Any]:
            return await _sessionless_call(
                http, gateway.url, "alice", "up__ask_user", arguments, {**cmcp, **extra}
            )

        first = (await call({}))["result"]
        (key,) = first["inputRequests"]
        answers = {key: {"action": "accept", "content": {"answer": "forty-two"}}}
        retry: dict[str, Any] = {"inputResponses": answers}
        if "requestState" in first:
            retry["requestState"] = first["requestState"]
        forged = await call({"requestState": "forged", "inputResponses": answers})
        second = await call(retry)
        replayed = await call({})
    assert first["resultType"] == "input_required"
    assert forged["error"]["code"] == -32036  # a forged state continues nothing (admission/rounds.py)
    assert second["result"]["content"][0]["text"] == "forty-two"
    assert replayed["error"]["code"] == -32052


async def test_a_clients_roots_change_reaches_its_own_upstream_session(
    tmp_path: Path, era_upstream_url: str
) -> None:
    """A session-era client's notifications/roots/list_changed is passed to its own upstream session."""
    async with (
        gateway_for(tmp_path, era_upstream_url, "session") as gateway,
        gateway.client(mode="legacy", list_roots_callback=answer_roots) as client,
    ):
        before = int(text_of(await client.call_tool("up__roots_changed", {})))
        with warnings.catch_warnings():  # a session-era notification, deprecated by 2026-07-28
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.send_roots_list_changed()
        with anyio.fail_after(10):
            while int(text_of(await client.call_tool("up__roots_changed", {}))) == before:
                await anyio.sleep(0.05)
        after = int(text_of(await client.call_tool("up__roots_changed", {})))
    assert after == before + 1
