"""A slow answer on a POST's SSE stream keeps the client's read timeout from firing (issue 22).

Through the ``bastion serve`` process an operator runs, in front of an upstream whose tool answers
only when the test releases it (``tests/e2e/holding_upstream.py``): a client whose read timeout
(3 s) is shorter than the call (6 s) gets ``: keepalive`` comment lines every
``gateway.sse_keepalive_s`` until the answer, so the call completes, for a raw HTTP client that
sees the comments and for the official SDK client, whose read timeout is per socket read
(``httpcore2``'s ``read(timeout=)``): any bytes reset it. A client that accepts only JSON gets
JSON, with nothing before it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.auth.bearer import hash_token
from tests.e2e.conftest import TOKENS
from tests.e2e.issue4_support import mcp_headers, open_session, tool_call
from tests.e2e.test_serve_process import Serve
from tests.e2e.test_serve_process import serving as serving  # the fixture
from tests.e2e.test_workers_e2e import HoldingUpstream
from tests.e2e.test_workers_e2e import holding_upstream as holding_upstream  # the fixture

pytestmark = pytest.mark.anyio

KEEPALIVE_S = 1.0
CLIENT_READ_TIMEOUT_S = 3.0
CALL_S = 6.0  # twice the client's read timeout
BOUND_S = 60.0  # generous: the machine is shared


def _config(tmp_path: Path, upstream_url: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"[gateway]\nupstream_timeout_s = 60.0\nsse_keepalive_s = {KEEPALIVE_S}\n\n"
        f'[servers.work]\nurl = "{upstream_url}"\n\n'
        f'[agents.alice]\ntoken_sha256 = "{hash_token(TOKENS["alice"])}"\n'
    )
    return path


async def _serve(tmp_path: Path, holding: HoldingUpstream, serving: list[Serve]) -> str:
    serve = Serve("--config", str(_config(tmp_path, holding.url)), "--data-dir", str(tmp_path / "data"))
    serving.append(serve)
    line = await anyio.to_thread.run_sync(serve.ready_line)
    return line.split()[2]


async def _release_after(holding: HoldingUpstream, delay_s: float) -> None:
    """Release the next held call ``delay_s`` after the upstream received it."""
    with anyio.fail_after(BOUND_S):
        await holding.next_hold()
    await anyio.sleep(delay_s)
    await holding.release()


async def test_a_slow_call_outlives_a_short_read_timeout_on_keepalive_comments(
    tmp_path: Path, holding_upstream: HoldingUpstream, serving: list[Serve]
) -> None:
    """The SSE answer of a 6 s call carries comment lines about every second; with a 3 s read timeout
    the client reads all of them and then the result. A JSON-only client's answer is plain JSON."""
    url = await _serve(tmp_path, holding_upstream, serving)
    timeout = httpx.Timeout(BOUND_S, read=CLIENT_READ_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout) as http, anyio.create_task_group() as tg:
        session_id = await open_session(http, url, TOKENS["alice"])
        headers = mcp_headers(TOKENS["alice"], session_id)  # accepts JSON and SSE
        tg.start_soon(_release_after, holding_upstream, CALL_S)
        lines: list[str] = []
        started = time.monotonic()
        with anyio.fail_after(BOUND_S):
            request = http.stream("POST", url, json=tool_call("work__hold"), headers=headers)
            async with request as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                lines = [line async for line in response.aiter_lines()]
        elapsed = time.monotonic() - started
        data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]
        assert data and data[-1]["id"] == 1 and data[-1]["result"]["content"][0]["text"] == "1"
        comments = [line for line in lines if line.startswith(":")]
        assert set(comments) == {": keepalive"}
        assert elapsed >= CALL_S and len(comments) >= int(CALL_S / KEEPALIVE_S) - 2, (elapsed, lines)

        # Accept: application/json only: a JSON answer cannot carry comments, and gets none.
        tg.start_soon(_release_after, holding_upstream, 2 * KEEPALIVE_S)
        json_only = httpx.Timeout(BOUND_S)
        with anyio.fail_after(BOUND_S):
            response = await http.post(
                url,
                json=tool_call("work__hold", request_id=2),
                headers={**headers, "accept": "application/json"},
                timeout=json_only,
            )
        assert response.headers["content-type"] == "application/json"
        assert response.json()["result"]["content"][0]["text"] == "2"


async def test_the_official_client_with_a_short_read_timeout_completes_a_slow_call(
    tmp_path: Path, holding_upstream: HoldingUpstream, serving: list[Serve]
) -> None:
    """The `mcp` 2.x client over httpx2 with a 3 s read timeout: a 6 s call answers, not ReadTimeout."""
    url = await _serve(tmp_path, holding_upstream, serving)
    timeout = httpx2.Timeout(BOUND_S, read=CLIENT_READ_TIMEOUT_S)
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS['alice']}"}, timeout=timeout) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(_release_after, holding_upstream, CALL_S)
        started = time.monotonic()
        with anyio.fail_after(BOUND_S):
            result = await client.call_tool("work__hold", {})
        assert time.monotonic() - started >= CALL_S
        assert not result.is_error and result.content[0].text == "1"  # type: ignore[union-attr]
