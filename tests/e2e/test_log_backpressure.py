"""A log reader that stops reading never stops the gateway (its log writer is off the event loop).

``bastion serve`` writes one access line per governed call to stderr. Here
stderr is a pipe nobody reads while 400 calls are made: a synchronous write
would fill the pipe's 64 KiB after some 150 lines and block the event loop,
so every later call would hang. With the writer thread the calls are answered,
and once the pipe is read every line is there, none lost.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.conftest import TOKENS, Upstream, gateway_config
from tests.e2e.issue4_support import answer_of, call, open_session, toml_dumps
from tests.e2e.test_first_hour import Serve

pytestmark = pytest.mark.anyio
CALLS = 400


@pytest.mark.timeout(180)
async def test_calls_are_answered_while_nobody_reads_the_log(
    tmp_path: Path, tools_upstream: Upstream
) -> None:
    config = gateway_config(tmp_path, tools_upstream.url)
    config["grants"] = [{"name": "all", "agent": "alice", "servers": ["tools"], "tools": ["*"]}]
    path = tmp_path / "gateway.toml"
    path.write_text(toml_dumps(config))
    serve = Serve.bastion("--config", str(path), "--data-dir", str(tmp_path / "data"))
    try:
        url = serve.url()
        token = TOKENS["alice"]
        async with httpx.AsyncClient(timeout=10) as http:
            session = await open_session(http, url, token)
            for n in range(CALLS):
                answer = answer_of(await call(http, url, token, session, "tools__echo", {"text": f"m{n}"}))
                assert "result" in answer, answer
        # Now read the pipe (as the process ends, which waits for its queued lines to be written).
        assert serve.process.stderr is not None
        read: list[str] = []
        reader = threading.Thread(target=lambda: read.append(serve.process.stderr.read()))  # type: ignore[union-attr]
        reader.start()
    finally:
        serve.stop()
    reader.join(timeout=30)
    log = "".join(read)
    lines = [orjson.loads(line) for line in log.splitlines() if line.startswith("{")]
    access = [line for line in lines if line.get("logger") == "bastion.access"]
    assert len(access) == CALLS, f"{len(access)} access lines for {CALLS} calls"
    assert not [line for line in lines if "dropped" in line], "nothing was dropped: the queue holds them"
