"""A ``requestState`` continues only the call it was issued for (issue #22 point 4, admission/rounds.py).

A sessionless (2026-07-28) client is answered ``input_required`` with a ``requestState`` in
two ways: Bastion parks a session-era upstream's mid-call question (servers ``up`` and
``other``, pinned to the session era), or a 2026 upstream answers ``input_required`` itself
(server ``modern``: the example ``confirm`` tool issues ``confirm-1``). Either way the client
holds only Bastion's token, good once, for the same agent, server, tool and arguments; every
other presentation is refused with its typed reason and leaves an audit entry naming the cause.
The upstream is a real SDK server process (``tests/e2e/era_upstream.py``); the probes are raw
HTTP, since the official client never sends a state it was not given.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from tests.e2e.conftest import TOKENS
from tests.e2e.era_support import era_upstream_url
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

__all__ = ["era_upstream_url"]  # the fixture, imported for pytest

_MODERN = "2026-07-28"
_QUESTION = {"question": "what?"}
_ANSWER = {"action": "accept", "content": {"answer": "forty-two"}}


class _Front:
    def __init__(self, url: str, http: httpx.AsyncClient, data: Path) -> None:
        self.url, self.http, self.data = url, http, data

    async def call(
        self, tool: str, arguments: dict[str, Any], extra: dict[str, Any] | None = None, agent: str = "alice"
    ) -> dict[str, Any]:
        meta = {
            "io.modelcontextprotocol/protocolVersion": _MODERN,
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        }
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta, **(extra or {})},
        }
        headers = {
            "authorization": f"Bearer {TOKENS[agent]}",
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": _MODERN,
            "mcp-method": "tools/call",
            "mcp-name": tool,
        }
        with anyio.fail_after(30):
            response = await self.http.post(self.url, json=body, headers=headers)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            lines = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
            return dict(json.loads(lines[-1]))
        return dict(response.json())

    async def ask(self, tool: str = "up__ask_user", agent: str = "alice") -> tuple[str, dict[str, Any]]:
        """A first round: the token handed out and the answers that complete it."""
        first = (await self.call(tool, _QUESTION if "ask_user" in tool else {}, agent=agent))["result"]
        assert first["resultType"] == "input_required"
        (key,) = first["inputRequests"]
        return first["requestState"], {key: _ANSWER}

    def refusals(self, agent: str = "alice") -> list[dict[str, Any]]:
        """The agent's refused entries with an input-round reason, straight from the SQLite file."""
        uri = f"file:{self.data / 'bastion.db'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute(
                "SELECT entry FROM entries WHERE json_extract(entry, '$.agent') = ?", (agent,)
            ).fetchall()
        entries = [orjson.loads(row[0]) for row in rows]
        return [e for e in entries if str(e.get("reason", "")).startswith("input_round_")]


@contextlib.asynccontextmanager
async def _front(tmp_path: Path, url: str, generation: str = "gateway-0") -> AsyncIterator[_Front]:
    config = {
        "gateway": {"upstream_timeout_s": 20.0},
        "servers": {
            "up": {"url": url, "era": "session"},
            "other": {"url": url, "era": "session"},
            "modern": {"url": url, "era": "sessionless"},
        },
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    app = create_app(
        snapshot_from_mapping(config, source=None, version="t"),
        RuntimeOptions(tmp_path / "data", generation=generation),
    )
    async with serve_on_loopback(app) as front, httpx.AsyncClient(timeout=30) as http:
        yield _Front(front, http, tmp_path / "data")


def _refused(reply: dict[str, Any], code: int, reason: str) -> None:
    assert reply["error"]["code"] == code, reply
    assert reply["error"]["data"]["reason"] == reason


async def test_a_forged_request_state_is_refused_and_audited(tmp_path: Path, era_upstream_url: str) -> None:
    """A requestState Bastion never issued continues nothing: input_round_unknown, audited ``unknown``."""
    async with _front(tmp_path, era_upstream_url) as front:
        _, answers = await front.ask()
        forged = await front.call(
            "up__ask_user", _QUESTION, {"requestState": "bastion-round.forged", "inputResponses": answers}
        )
        raw = await front.call(
            "up__ask_user", _QUESTION, {"requestState": "confirm-1", "inputResponses": answers}
        )
        _refused(forged, -32036, "input_round_unknown")
        _refused(raw, -32036, "input_round_unknown")
        causes = [(e["tool"], e["detail"]["cause"]) for e in front.refusals()]
    assert causes == [("ask_user", "unknown"), ("ask_user", "unknown")]


async def test_a_replayed_request_state_is_refused_and_audited(tmp_path: Path, era_upstream_url: str) -> None:
    """A requestState is good once: the second retry with it is input_round_unknown, audited ``spent``."""
    async with _front(tmp_path, era_upstream_url) as front:
        state, answers = await front.ask()
        retry = {"requestState": state, "inputResponses": answers}
        done = await front.call("up__ask_user", _QUESTION, retry)
        again = await front.call("up__ask_user", _QUESTION, retry)
        assert done["result"]["content"][0]["text"] == "forty-two"
        _refused(again, -32036, "input_round_unknown")
        (entry,) = front.refusals()
    assert entry["detail"]["cause"] == "spent"
    assert entry["decision"] == "deny"


@pytest.mark.parametrize(
    ("tool", "arguments", "cause"),
    [
        pytest.param("up__echo", {"text": "hi"}, "other_target", id="same-server-other-tool"),
        pytest.param("other__ask_user", _QUESTION, "other_server", id="other-server"),
        pytest.param("up__ask_user", {"question": "who?"}, "other_binding", id="other-arguments"),
    ],
)
async def test_a_request_state_sent_with_another_call_is_refused_and_audited(
    tmp_path: Path, era_upstream_url: str, tool: str, arguments: dict[str, Any], cause: str
) -> None:
    """The caller's own requestState, presented with another tool, server or arguments: input_round_mismatch.

    Before issue #22 the paused call completed with a receipt naming the other tool, or the state
    was forwarded to the other server. The token is spent: the round it named is not continued.
    """
    async with _front(tmp_path, era_upstream_url) as front:
        state, answers = await front.ask()
        retry = {"requestState": state, "inputResponses": answers}
        crossed = await front.call(tool, arguments, retry)
        after = await front.call("up__ask_user", _QUESTION, retry)
        _refused(crossed, -32037, "input_round_mismatch")
        _refused(after, -32036, "input_round_unknown")
        first, second = front.refusals()
    assert (first["reason"], first["detail"]["cause"]) == ("input_round_mismatch", cause)
    assert (second["reason"], second["detail"]["cause"]) == ("input_round_unknown", "spent")


async def test_another_agents_request_state_is_refused_and_audited(
    tmp_path: Path, era_upstream_url: str
) -> None:
    """Bob holding Alice's requestState is answered as for an unknown one; Alice's round still completes."""
    async with _front(tmp_path, era_upstream_url) as front:
        state, answers = await front.ask()
        retry = {"requestState": state, "inputResponses": answers}
        by_bob = await front.call("up__ask_user", _QUESTION, retry, agent="bob")
        by_alice = await front.call("up__ask_user", _QUESTION, retry)
        _refused(by_bob, -32036, "input_round_unknown")
        assert by_alice["result"]["content"][0]["text"] == "forty-two"
        (entry,) = front.refusals("bob")
    assert entry["detail"]["cause"] == "other_agent"
    assert front.refusals("alice") == []


async def test_an_upstream_issued_request_state_is_wrapped_and_bound(
    tmp_path: Path, era_upstream_url: str
) -> None:
    """A 2026 upstream's own requestState never reaches the client; Bastion's token is bound like its own.

    The upstream issues ``confirm-1``: the client sees an opaque token instead; presented by its
    agent with the same call, the upstream gets ``confirm-1`` back (it echoes it); presented by
    another agent, again, raw, or with another tool, it is refused.
    """
    async with _front(tmp_path, era_upstream_url) as front:
        state, answers = await front.ask("modern__confirm")
        assert "confirm-1" not in state and state.startswith("bastion-round.")
        retry = {"requestState": state, "inputResponses": answers}
        raw = await front.call(
            "modern__confirm", {}, {"requestState": "confirm-1", "inputResponses": answers}
        )
        by_bob = await front.call("modern__confirm", {}, retry, agent="bob")
        done = await front.call("modern__confirm", {}, retry)
        again = await front.call("modern__confirm", {}, retry)
        state2, answers2 = await front.ask("modern__confirm")
        crossed = await front.call(
            "modern__echo", {"text": "hi"}, {"requestState": state2, "inputResponses": answers2}
        )
        _refused(raw, -32036, "input_round_unknown")
        _refused(by_bob, -32036, "input_round_unknown")
        assert done["result"]["content"][0]["text"] == "confirmed:forty-two:confirm-1"
        _refused(again, -32036, "input_round_unknown")
        _refused(crossed, -32037, "input_round_mismatch")
        causes = [e["detail"]["cause"] for e in front.refusals()]
        (bobs,) = front.refusals("bob")
    assert causes == ["unknown", "spent", "other_target"]
    assert bobs["detail"]["cause"] == "other_agent"


async def test_a_request_state_is_refused_typed_at_another_replica(
    tmp_path: Path, era_upstream_url: str
) -> None:
    """Tokens live at the replica that issued them: at another (same store) one is input_round_unknown,
    audited there, and the issuing replica still completes the round."""
    async with (
        _front(tmp_path, era_upstream_url, "gateway-1") as first,
        _front(tmp_path, era_upstream_url, "gateway-2") as second,
    ):
        for state_of in ("up__ask_user", "modern__confirm"):
            state, answers = await first.ask(state_of)
            arguments = _QUESTION if "ask_user" in state_of else {}
            retry = {"requestState": state, "inputResponses": answers}
            elsewhere = await second.call(state_of, arguments, retry)
            here = await first.call(state_of, arguments, retry)
            _refused(elsewhere, -32036, "input_round_unknown")
            assert "result" in here and here["result"].get("resultType") != "input_required", here
        causes = [e["detail"]["cause"] for e in first.refusals()]
    assert causes == ["unknown", "unknown"]
