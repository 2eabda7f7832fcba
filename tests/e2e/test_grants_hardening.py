"""Grants that leak nothing and charge only what runs (issue #12 points 10 and 11).

The gateway and grants of ``test_grants_e2e.py``. A tool hidden by grants is
answered exactly as a tool that does not exist (the audit keeps
``grant_denied``), and a call refused after its grant decision (a replayed
execution id) gives its rate-limit token back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Upstream
from tests.e2e.issue4_support import (
    FileGateway,
    answer_of,
    call,
    export_entries,
    file_gateway,
    open_session,
    reason_of,
    write_config,
)
from tests.e2e.test_grants_e2e import ALICE, config

pytestmark = pytest.mark.anyio


@pytest.fixture
async def granted(
    tmp_path: Path, tools_upstream: Upstream
) -> AsyncIterator[tuple[FileGateway, httpx.AsyncClient]]:
    path = tmp_path / "bastion.toml"
    write_config(path, config(tmp_path, tools_upstream.url))
    async with file_gateway(path, tmp_path / "data") as running, httpx.AsyncClient(timeout=30) as http:
        yield running, http


def _without_receipt(answer: dict[str, Any], name: str) -> dict[str, Any]:
    error = dict(answer["error"])
    error["data"] = {k: v for k, v in error["data"].items() if k != "receipt"}
    error["message"] = error["message"].replace(name, "<name>")
    error["data"]["tool"] = error["data"]["tool"].replace(name, "<name>")
    return error


async def test_a_tool_hidden_by_grants_is_answered_as_an_unknown_tool(
    granted: tuple[FileGateway, httpx.AsyncClient],
) -> None:
    """Hidden and missing tools get the same code, reason, message and data; the audit says grant_denied."""
    gw, http = granted
    session_id = await open_session(http, gw.url, ALICE)
    hidden = answer_of(await call(http, gw.url, ALICE, session_id, "tools__hang"))
    missing = answer_of(await call(http, gw.url, ALICE, session_id, "tools__no_such_tool"))
    assert reason_of(hidden) == "unknown_tool"
    assert _without_receipt(hidden, "tools__hang") == _without_receipt(missing, "tools__no_such_tool")
    evidence_session_id = hidden["error"]["data"]["receipt"]["evidence_session_id"]
    entries = await export_entries(http, gw.origin, evidence_session_id, token=ALICE)
    refusals = {(e["tool"], e["reason"]) for e in entries if e["event"] == "refused"}
    assert refusals == {("hang", "grant_denied"), (None, "unknown_tool")}


async def test_a_call_refused_after_its_grant_decision_spends_no_rate_token(
    granted: tuple[FileGateway, httpx.AsyncClient],
) -> None:
    """``rate = "3/minute"``: two replays refused in between, three fresh calls run, the fourth is limited."""
    gw, http = granted
    session_id = await open_session(http, gw.url, ALICE)

    async def count(execution_id: str) -> str | None:
        answer = answer_of(
            await call(http, gw.url, ALICE, session_id, "tools__count", execution_id=execution_id)
        )
        return reason_of(answer)

    assert await count("rate-1") is None
    assert await count("rate-1") == "execution_replay"
    assert await count("rate-1") == "execution_replay"
    assert await count("rate-2") is None
    assert await count("rate-3") is None
    assert await count("rate-4") == "rate_limited"
