"""Step-up approval through the real ``bastion serve`` and the official SDK client (issue 27).

A grant with ``approval`` makes its calls wait for a named approver: approved,
the call runs once; denied or timed out, it is a typed refusal and never
reaches the upstream; an approval is bound to its call's binding and
execution id, so other arguments under that execution id are refused and a
retry after it ran is the execution's replay; only an approver the grant
names decides (not the admin, not an agent, not another approver), once; the
client hears ``notifications/progress`` while it waits; the request, the
decision, the approver and the times are entries of the call's chain. Both
client eras (the SDK's default and ``mode='legacy'``). On PostgreSQL, two
``bastion serve`` replicas: the call waits at one, the approval is taken at
the other.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from bastion.auth.bearer import hash_token
from bastion.cli.main import main
from tests.e2e.conftest import TOKENS, Upstream, counter_value
from tests.e2e.issue4_support import (
    ADMIN_TOKEN,
    AUDITOR_TOKEN,
    answer_of,
    base_config,
    bearer,
    call,
    create_agent_session,
    export_entries,
    mcp_headers,
    open_session,
    reason_of,
    sdk_client,
    static_token,
    toml_dumps,
    tool_call,
)
from tests.e2e.test_workers_e2e import GatewayProcess, gateway_process

pytestmark = pytest.mark.anyio

APPROVER_TOKENS = {"carol": "carol-approver-" + "c" * 32, "dave": "dave-approver-" + "f" * 32}
WAIT_S = 30.0
MODES = [pytest.param("auto", id="sessionless"), pytest.param("legacy", id="legacy")]


def approval_config(tmp_path: Path, tools_url: str, *, store: str | None = None) -> Path:
    config = base_config(tmp_path, tools_url)
    config["auth"]["approvers"] = {
        name: {"token_sha256": hash_token(t)} for name, t in APPROVER_TOKENS.items()
    }
    config["grants"] = [
        {"name": "guarded", "agent": "alice", "servers": ["tools"], "tools": ["increment"],
         "approval": {"approvers": ["carol"], "timeout_s": 60, "show_arguments": True}},
        {"name": "hidden-args", "agent": "alice", "servers": ["tools"], "tools": ["slow"],
         "approval": {"approvers": ["carol"], "timeout_s": 60}},
        {"name": "hurried", "agent": "alice", "servers": ["tools"], "tools": ["echo"],
         "approval": {"approvers": ["carol", "dave"], "timeout_s": 1.5, "show_arguments": True}},
        {"name": "reads", "agent": "alice", "servers": ["tools"], "tools": ["count"]},
        {"name": "erin-guarded", "agent": "erin", "servers": ["tools"], "tools": ["increment"],
         "approval": {"approvers": ["carol"], "timeout_s": 60}},
    ]  # fmt: skip
    if store is not None:
        config["store"] = {"url": store}
    path = tmp_path / "gateway.toml"
    path.write_text(toml_dumps(config))
    return path


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, tools: Upstream, *extra: str, name: str = "a", data: str | None = None
) -> AsyncIterator[GatewayProcess]:
    config = tmp_path / "gateway.toml"
    if not config.exists():
        approval_config(tmp_path, tools.url)
    data_dir = tmp_path / f"data-{data or name}"
    async with gateway_process(
        config, data_dir, f"gateway-{name}", tmp_path / f"{name}.log", *extra
    ) as running:
        yield running


async def pending_request(http: httpx.AsyncClient, origin: str, tool: str) -> dict[str, Any]:
    """The one pending request for ``tool``, waiting for it to appear (bounded by the caller)."""
    while True:
        answer = await http.get(
            f"{origin}/admin/approvals", params={"state": "pending"}, headers=bearer(APPROVER_TOKENS["carol"])
        )
        assert answer.status_code == 200, answer.text
        found = [a for a in answer.json()["approvals"] if a["tool"] == tool]
        if found:
            assert len(found) == 1, found
            return found[0]
        await anyio.sleep(0.05)


async def decide(
    http: httpx.AsyncClient, origin: str, approval_id: str, action: str, token: str = APPROVER_TOKENS["carol"]
) -> httpx.Response:
    return await http.post(f"{origin}/admin/approvals/{approval_id}/{action}", headers=bearer(token), json={})


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``bastion approvals ...`` through the CLI's entry point, its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["approvals", *argv])
    return code, out.getvalue(), err.getvalue()


def events_of(entries: list[dict[str, Any]], call_id: str) -> list[str]:
    return [e["event"] for e in entries if e["call_id"] == call_id]


@pytest.mark.parametrize("mode", MODES)
async def test_an_approved_call_runs_once_and_its_chain_says_who_approved_when(
    mode: str, tmp_path: Path, tools_upstream: Upstream
) -> None:
    """The call waits (progress while it does), carol approves with the CLI, it runs once; audited."""
    before = counter_value(tools_upstream.counter_file)
    progress: list[float] = []
    token_file = tmp_path / "carol.token"
    token_file.write_text(APPROVER_TOKENS["carol"])
    result: Any = None

    async def progressed(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with serving(tmp_path, tools_upstream) as gw, httpx.AsyncClient(timeout=WAIT_S) as http:
        async with sdk_client(gw.url, static_token("alice"), mode=mode) as client:

            async def run_call() -> None:
                nonlocal result
                result = await client.call_tool("tools__increment", {}, progress_callback=progressed)

            with anyio.fail_after(WAIT_S):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run_call)
                    request = await pending_request(http, gw.origin, "increment")
                    assert counter_value(tools_upstream.counter_file) == before  # nothing sent yet
                    code, shown, _ = run_cli(
                        "show", request["approval_id"], "--url", gw.url, "--token-file", str(token_file)
                    )
                    assert code == 0
                    for seen in (
                        "agent:",
                        "alice",
                        "server:",
                        "tools",
                        "increment",
                        request["binding"],
                        "arguments:",
                    ):
                        assert seen in shown
                    code, listed, _ = run_cli("list", "--url", gw.url, "--token-file", str(token_file))
                    assert code == 0 and request["approval_id"] in listed
                    code, _, err = run_cli(
                        "approve", request["approval_id"], "--url", gw.url, "--token-file", str(token_file)
                    )
                    assert code == 0, err
                    again, _, err = run_cli(
                        "deny", request["approval_id"], "--url", gw.url, "--token-file", str(token_file)
                    )
                    assert again == 1 and "approval_already_decided" in err  # decided once
        assert result is not None and result.is_error is False
        assert counter_value(tools_upstream.counter_file) == before + 1
        assert progress, "no notifications/progress while the call waited"
        receipt = result.meta["io.bastion/receipt"]
        entries = await export_entries(http, gw.origin, receipt["evidence_session_id"], token=AUDITOR_TOKEN)
    events = events_of(entries, receipt["call_id"])
    assert events[:3] == ["approval_requested", "approval_granted", "admitted"], events
    granted = next(e for e in entries if e["event"] == "approval_granted")
    assert (
        granted["detail"]["approver"] == "carol"
        and granted["detail"]["approval_id"] == request["approval_id"]
    )
    assert granted["detail"]["requested_at"] and granted["detail"]["decided_at"]
    assert granted["binding"] == request["binding"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_denied_call_is_a_typed_refusal_and_never_sent(
    mode: str, tmp_path: Path, tools_upstream: Upstream
) -> None:
    """An agent session's call (its human shown): dave is not named by the grant (403), the admin
    may not decide (403), an agent may not (401), carol denies: -32090, never sent."""
    before = counter_value(tools_upstream.counter_file)
    refused: MCPError | None = None
    async with serving(tmp_path, tools_upstream) as gw, httpx.AsyncClient(timeout=WAIT_S) as http:
        erin = await create_agent_session(http, gw.origin, agent="erin", human="erin@example.com")
        async with sdk_client(gw.url, erin.token, mode=mode) as client:

            async def run_call() -> None:
                nonlocal refused
                try:
                    await client.call_tool("tools__increment", {})
                except MCPError as exc:
                    refused = exc

            with anyio.fail_after(WAIT_S):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run_call)
                    request = await pending_request(http, gw.origin, "increment")
                    assert (request["agent"], request["human"]) == ("erin", "erin@example.com")
                    assert request["agent_session_id"] == erin.agent_session_id
                    approval_id = request["approval_id"]
                    not_named = await decide(http, gw.origin, approval_id, "approve", APPROVER_TOKENS["dave"])
                    assert not_named.status_code == 403
                    assert not_named.json()["error"]["reason"] == "approver_not_named"
                    admin = await decide(http, gw.origin, approval_id, "approve", ADMIN_TOKEN)
                    assert admin.status_code == 403
                    assert admin.json()["error"]["reason"] == "approver_role_required"
                    agent = await decide(http, gw.origin, approval_id, "approve", TOKENS["alice"])
                    assert agent.status_code == 401
                    denied = await decide(http, gw.origin, approval_id, "deny")
                    assert denied.status_code == 200 and denied.json()["approval"]["decided_by"] == "carol"
        assert refused is not None
        assert refused.error.code == -32090 and (refused.error.data or {})["reason"] == "approval_denied"
        assert counter_value(tools_upstream.counter_file) == before


async def test_a_call_nobody_decides_times_out_typed_and_is_audited(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """The hurried grant waits 1.5 s: approval_timeout (-32091); a late approval is 409."""
    async with serving(tmp_path, tools_upstream) as gw, httpx.AsyncClient(timeout=WAIT_S) as http:
        async with sdk_client(gw.url, static_token("alice"), mode="auto") as client:
            with anyio.fail_after(WAIT_S), pytest.raises(MCPError) as caught:
                await client.call_tool("tools__echo", {"text": "anyone?"})
        assert caught.value.error.code == -32091
        assert (caught.value.error.data or {})["reason"] == "approval_timeout"
        listed = await http.get(f"{gw.origin}/admin/approvals?state=all", headers=bearer(ADMIN_TOKEN))
        (request,) = listed.json()["approvals"]
        assert request["state"] == "timed_out" and request["arguments"] == {"text": "anyone?"}
        late = await decide(http, gw.origin, request["approval_id"], "approve")
        assert late.status_code == 409
        receipt = (caught.value.error.data or {})["receipt"]
        entries = await export_entries(http, gw.origin, receipt["evidence_session_id"], token=AUDITOR_TOKEN)
    assert events_of(entries, receipt["call_id"]) == ["approval_requested", "approval_timed_out", "refused"]


async def test_an_approval_is_never_reused_for_other_arguments_nor_replayed(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """Approved for exec X with steps=1: X with steps=2 is approval_mismatch; X again is a replay."""
    token = static_token("alice")
    async with serving(tmp_path, tools_upstream) as gw, httpx.AsyncClient(timeout=WAIT_S) as http:
        session_id = await open_session(http, gw.url, token)

        async def slow(steps: int) -> dict[str, Any]:
            arguments = {"seconds": 0, "steps": steps}
            sent = await call(
                http, gw.url, token, session_id, "tools__slow", arguments, execution_id="exec-x"
            )
            return answer_of(sent)

        first: dict[str, Any] = {}

        async def run_call() -> None:
            first.update(await slow(1))

        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_call)
                request = await pending_request(http, gw.origin, "slow")
                assert request["arguments_shown"] is False and request["arguments"] is None
                assert request["execution_id"] == "exec-x"
                assert (await decide(http, gw.origin, request["approval_id"], "approve")).status_code == 200
        assert "result" in first, first
        other = await slow(2)
        assert other["error"]["code"] == -32093 and reason_of(other) == "approval_mismatch"
        again = await slow(1)
        assert reason_of(again) == "execution_replay"
        listed = (
            await http.get(f"{gw.origin}/admin/approvals?state=all", headers=bearer(ADMIN_TOKEN))
        ).json()
        assert len([a for a in listed["approvals"] if a["tool"] == "slow"]) == 1  # asked once


async def test_a_client_that_goes_away_cancels_its_request(tmp_path: Path, tools_upstream: Upstream) -> None:
    """A sessionless client that closes its stream while waiting: the request is cancelled, audited."""
    async with serving(tmp_path, tools_upstream) as gw, httpx.AsyncClient(timeout=WAIT_S) as http:
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:

                async def run_call() -> None:
                    async with sdk_client(gw.url, static_token("alice"), mode="auto") as client:
                        await client.call_tool("tools__increment", {})

                tg.start_soon(run_call)
                request = await pending_request(http, gw.origin, "increment")
                tg.cancel_scope.cancel()
            while True:
                shown = await http.get(
                    f"{gw.origin}/admin/approvals/{request['approval_id']}", headers=bearer(ADMIN_TOKEN)
                )
                if shown.json()["approval"]["state"] != "pending":
                    break
                await anyio.sleep(0.05)
        assert shown.json()["approval"]["state"] == "cancelled"
        late = await decide(http, gw.origin, request["approval_id"], "approve")
        assert late.status_code == 409


async def test_two_replicas_the_call_waits_at_one_and_is_approved_at_the_other(
    tmp_path: Path, tools_upstream: Upstream, postgres_url: str
) -> None:
    """Both ``bastion serve`` on one PostgreSQL: approving at B lets A's waiting call run, once."""
    approval_config(tmp_path, tools_upstream.url, store=postgres_url)
    before = counter_value(tools_upstream.counter_file)
    result: Any = None
    async with (
        serving(tmp_path, tools_upstream, name="a") as a,
        serving(tmp_path, tools_upstream, name="b") as b,
        httpx.AsyncClient(timeout=WAIT_S) as http,
        sdk_client(a.url, static_token("alice"), mode="auto") as client,
    ):

        async def run_call() -> None:
            nonlocal result
            result = await client.call_tool("tools__increment", {})

        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_call)
                request = await pending_request(http, b.origin, "increment")
                approved = await decide(http, b.origin, request["approval_id"], "approve")
                assert approved.status_code == 200, approved.text
    assert result is not None and result.is_error is False
    assert counter_value(tools_upstream.counter_file) == before + 1
    assert json.loads(json.dumps(result.meta))["io.bastion/receipt"]["call_id"] == request["call_id"]


async def test_a_killed_replica_s_waiting_call_is_retried_and_runs_once(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    """kill -9 of the replica holding a waiting call: nothing was sent; the retry of the same execution
    at the next replica waits on the same request, is approved there and runs once; then it is a replay."""
    token = static_token("alice")
    before = counter_value(tools_upstream.counter_file)
    async with httpx.AsyncClient(timeout=WAIT_S) as http:
        async with serving(tmp_path, tools_upstream, name="a", data="shared") as a:
            session_a = await open_session(http, a.url, token)
            with anyio.fail_after(WAIT_S):
                async with anyio.create_task_group() as tg:

                    async def doomed() -> None:
                        with contextlib.suppress(httpx.HTTPError):
                            await call(
                                http, a.url, token, session_a, "tools__increment", {}, execution_id="exec-k"
                            )

                    tg.start_soon(doomed)
                    request = await pending_request(http, a.origin, "increment")
                    a.signal(signal.SIGKILL)
                    await a.process.wait()
        assert counter_value(tools_upstream.counter_file) == before  # nothing was sent
        async with serving(tmp_path, tools_upstream, name="b", data="shared") as b:
            session_b = await open_session(http, b.url, token)
            retried: dict[str, Any] = {}
            message = tool_call("tools__increment", {}, execution_id="exec-k", progress_token="p1")
            with anyio.fail_after(WAIT_S):
                async with http.stream(
                    "POST", b.url, headers=mcp_headers(token, session_b), json=message
                ) as sent:
                    async for line in sent.aiter_lines():
                        if not line.startswith("data:") or not line[5:].strip():
                            continue
                        frame = json.loads(line[5:])
                        if frame.get("method") == "notifications/progress" and not retried:
                            # The retry waits on the first attempt's request: approve it now, at b.
                            retried["waiting"] = frame["params"]["message"]
                            approved = await decide(http, b.origin, request["approval_id"], "approve")
                            assert approved.status_code == 200
                        elif frame.get("id") == 1:
                            retried.update(frame)
                            break
            assert request["approval_id"] in retried["waiting"]
            assert "result" in retried, retried
            assert counter_value(tools_upstream.counter_file) == before + 1
            again = answer_of(
                await call(http, b.url, token, session_b, "tools__increment", {}, execution_id="exec-k")
            )
            assert reason_of(again) == "execution_replay"
            assert counter_value(tools_upstream.counter_file) == before + 1
