"""Input-required rounds beyond ``tools/call`` (issue 8: elicitation in both styles, every pairing).

A sessionless (2026-07-28) client has no back-channel; on a session-era upstream path Bastion
turns the upstream's back-channel questions into ``input_required`` rounds. The 2026 wire
allows such rounds on ``prompts/get`` and ``resources/read`` too, so a prompt that asks its
client for input must work for that client as it does for ``tools/call``. The upstream is
the conformance fixture (an ``mcp`` SDK server), pinned to the session era.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from bastion.app import create_app
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.upstream_support import listening_upstream
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

_MODERN = "2026-07-28"
_PROMPT = "test_input_required_result_prompt"


@pytest.fixture(scope="module")
def fixture_url() -> Iterator[str]:
    with listening_upstream(
        [sys.executable, "-m", "tests.fixtures.conformance_server", "--port", "0"]
    ) as url:
        yield url


def _prompts_get(extra: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": _MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "prompts/get",
        "params": {"name": _PROMPT, "_meta": meta, **extra},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": _MODERN,
        "mcp-method": "prompts/get",
        "mcp-name": _PROMPT,
    }
    return body, headers


async def test_a_prompt_that_asks_is_served_in_rounds_to_a_sessionless_client(
    tmp_path: Path, fixture_url: str
) -> None:
    """prompts/get on a session-era path answers input_required, then the prompt once the client answers."""
    config = {
        "servers": {"fx": {"url": fixture_url, "era": "session", "transparent": True}},
        "agents": {"suite": {"anonymous": True}},
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"), RuntimeOptions(tmp_path / "data")
    )
    async with serve_on_loopback(app) as url, httpx2.AsyncClient(timeout=30) as http:
        with anyio.fail_after(30):
            body, headers = _prompts_get({})
            first = (await http.post(url, json=body, headers=headers)).json()["result"]
            (key,) = first["inputRequests"]
            answers = {key: {"action": "accept", "content": {"context": "test context"}}}
            body, headers = _prompts_get({"requestState": first["requestState"], "inputResponses": answers})
            done = (await http.post(url, json=body, headers=headers)).json()
    assert first["resultType"] == "input_required"
    assert first["inputRequests"][key]["method"] == "elicitation/create"
    assert done["result"]["messages"][0]["content"]["text"] == "Use this context: test context"
