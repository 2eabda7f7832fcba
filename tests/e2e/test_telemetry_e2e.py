"""What an operator sees of each governed call: ``GET /metrics`` and the access line (issue #25).

A real ``bastion serve`` relays real traffic to a real upstream
(``tests/e2e/holding_upstream.py``: the example tools); then its ``/metrics``
is read with the real Prometheus parser (``prometheus_client.parser``) and
its stderr is read as JSON lines. Counts are exact: the traffic is known.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bastion.auth.bearer import hash_token
from tests.e2e.conftest import TOKENS
from tests.e2e.test_evidence_e2e import auth, call_params, receipt_of
from tests.e2e.test_shared_evidence_crash import bastion_serve
from tests.e2e.test_transport_rules import MODERN_META, modern_headers, rpc
from tests.e2e.test_workers_e2e import HoldingUpstream, holding_upstream

pytestmark = pytest.mark.anyio

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "observability"

__all__ = ["holding_upstream"]  # the fixture, used by name

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def deployed_expressions() -> list[str]:
    """Every PromQL expression of the shipped alert rules and Grafana dashboard."""
    rules = yaml.safe_load((DEPLOY / "bastion-alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((DEPLOY / "bastion-dashboard.json").read_text())
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [variable["query"] for variable in dashboard["templating"]["list"]]
    return exprs


def write_config(path: Path, upstream_url: str, gateway: str, grants: str = "") -> Path:
    agents = "".join(
        f'[agents.{name}]\ntoken_sha256 = "{hash_token(token)}"\n' for name, token in TOKENS.items()
    )
    path.write_text(f'[gateway]\n{gateway}\n\n[servers.work]\nurl = "{upstream_url}"\n\n{agents}\n{grants}')
    return path


#: alice may call every tool of work; bob only count, once a minute (his second call: rate_limited).
GRANTS = """
[[grants]]
name = "alice-all"
agent = "alice"
servers = ["work"]
tools = ["*"]

[[grants]]
name = "bob-count"
agent = "bob"
servers = ["work"]
tools = ["count"]
rate = "1/minute"
"""


#: A stdio server beside the HTTP one, so the stdio process families have samples to check.
LOCAL_STDIO = f"""
[servers.local]
command = {json.dumps(sys.executable)}
args = ["-m", "bastion.examples.notes_server"]
env = {{ BASTION_NOTES_FILE = "{{process_dir}}/notes.jsonl" }}
"""


async def scrape(http: httpx.AsyncClient, url: str) -> Samples:
    """Every sample of ``GET /metrics``, parsed by prometheus_client's own parser."""
    response = await http.get(url.removesuffix("/mcp") + "/metrics")
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def access_lines(log: Path) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]
    return [line for line in lines if line.get("logger") == "bastion.access"]


async def prompts_get(http: httpx.AsyncClient, url: str, name: str) -> dict[str, Any]:
    params = {"name": name, "_meta": MODERN_META}
    response = await http.post(
        url, headers={**modern_headers("prompts/get", name), **auth("alice")}, json=rpc("prompts/get", params)
    )
    answer: dict[str, Any] = response.json()
    return answer


async def sessionless_call(
    http: httpx.AsyncClient, url: str, name: str, arguments: dict[str, Any], *, agent: str = "alice"
) -> dict[str, Any]:
    """One raw 2026-07-28 ``tools/call``; its JSON-RPC answer, result or refusal."""
    params = call_params(name, arguments, meta=MODERN_META)
    response = await http.post(
        url, headers={**modern_headers("tools/call", name), **auth(agent)}, json=rpc("tools/call", params)
    )
    answer: dict[str, Any] = response.json()
    return answer


async def traffic(http: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """Three echoes and one invalid echo (alice), two unknown tools (alice), two counts (bob)."""
    answers = [await sessionless_call(http, url, "work__echo", {"text": f"n{i}"}) for i in range(3)]
    answers.append(await sessionless_call(http, url, "work__echo", {}))
    answers.append(await sessionless_call(http, url, "work__nope", {}))
    answers.append(await sessionless_call(http, url, "elsewhere__tool", {"secret": "s3cr3t-value"}))
    answers.append(await sessionless_call(http, url, "work__count", {}, agent="bob"))
    answers.append(await sessionless_call(http, url, "work__count", {}, agent="bob"))
    return answers


async def test_metrics_count_every_governed_call_by_outcome_and_the_access_log_has_one_line_each(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    config = write_config(
        tmp_path / "gateway.toml", holding_upstream.url, "metrics_agents = 1", GRANTS + LOCAL_STDIO
    )
    log = tmp_path / "gateway.log"
    async with (
        httpx.AsyncClient(timeout=30) as http,
        bastion_serve(config, tmp_path / "data", log) as (_, url),
    ):
        answers = await traffic(http, url)
        prompt = await prompts_get(http, url, "work__no_such_prompt")
        samples = await scrape(http, url)
    assert [("result" in a) for a in answers] == [True, True, True, True, False, False, True, False]
    assert answers[7]["error"]["data"]["reason"] == "rate_limited"
    assert answers[3]["result"]["isError"] is True
    assert "error" in prompt

    calls = "bastion_tool_calls_total"
    echo = {"server": "work", "tool": "echo", "agent": "alice"}
    assert value(samples, calls, **echo, outcome="completed", reason="") == 3
    assert value(samples, calls, **echo, outcome="failed", reason="") == 1
    unknown = {"server": "", "tool": "(unknown)", "agent": "alice", "outcome": "refused"}
    assert value(samples, calls, **unknown, reason="unknown_tool") == 2  # one value, never the name sent
    # metrics_agents = 1: alice came first and has her own value; bob is "other".
    other = {"server": "work", "tool": "count", "agent": "other"}
    assert value(samples, calls, **other, outcome="completed", reason="") == 1
    assert value(samples, calls, **other, outcome="refused", reason="rate_limited") == 1
    assert not any(dict(labels).get("agent") == "bob" for _, labels in samples)
    assert not any("nope" in str(labels) or "elsewhere" in str(labels) for _, labels in samples)

    whole, upstream = "bastion_tool_call_duration_seconds", "bastion_tool_call_upstream_duration_seconds"
    assert value(samples, f"{whole}_count", server="work", tool="echo") == 4
    assert value(samples, f"{upstream}_count", server="work", tool="echo") == 4
    assert value(samples, f"{whole}_count", server="", tool="(unknown)") == 2
    assert value(samples, f"{upstream}_count", server="", tool="(unknown)") in (None, 0)
    whole_s = value(samples, f"{whole}_sum", server="work", tool="echo")
    upstream_s = value(samples, f"{upstream}_sum", server="work", tool="echo")
    assert whole_s is not None and upstream_s is not None and 0 < upstream_s <= whole_s

    refusals = "bastion_refusals_total"
    assert value(samples, refusals, method="tools/call", reason="unknown_tool") == 2
    assert value(samples, refusals, method="tools/call", reason="rate_limited") == 1  # rate-limit rejections
    requests = "bastion_requests_total"
    assert value(samples, requests, method="prompts/get", outcome="refused", reason="unknown_prompt") == 1
    assert value(samples, refusals, method="prompts/get", reason="unknown_prompt") == 1
    assert value(samples, "bastion_requests_in_flight", method="tools/call") == 0
    assert value(samples, "bastion_upstream_up", server="work") == 1
    assert value(samples, "bastion_upstream_processes", server="local", scope="listing") == 1
    assert value(samples, "bastion_upstream_process_crashes_total", server="local") == 0
    assert value(samples, "bastion_policy_snapshot_lag_seconds") == 0
    assert value(samples, "bastion_store_degraded") == 0
    assert value(samples, "bastion_sessionless_agent_sessions") == 2  # alice's and bob's shared chains
    assert value(samples, "bastion_transport_sessions") == 0  # no session-era client
    appends = value(samples, "bastion_store_write_seconds_count")
    assert appends is not None and appends >= len(answers)  # every call appended its entries
    transactions = value(samples, "bastion_store_transactions_total")
    writes = value(samples, "bastion_store_writes_total")
    assert transactions is not None and writes is not None and writes >= transactions >= 1
    # Every commit timed (its fsync) and its batch counted: the histograms agree with the counters
    # (read a moment later in the same scrape, so a background commit may land in between).
    commits = value(samples, "bastion_store_commit_seconds_count")
    batches = value(samples, "bastion_store_batch_size_count")
    batched = value(samples, "bastion_store_batch_size_sum")
    assert commits is not None and batches is not None and batched is not None
    assert transactions <= commits <= transactions + 2 and transactions <= batches <= transactions + 2
    assert writes <= batched <= writes + 2 * 256
    assert value(samples, "bastion_store_batch_size_bucket", le="+Inf") == batches
    commit_s = value(samples, "bastion_store_commit_seconds_sum")
    assert commit_s is not None and commit_s > 0

    # deploy/observability: every metric its alerts and dashboard use is in this real output.
    names = {name for name, _ in samples}
    used = {name for expr in deployed_expressions() for name in re.findall(r"\bbastion_[a-z_]+\b", expr)}
    assert len(used) >= 10
    assert used <= names, sorted(used - names)

    raw = log.read_bytes()
    assert b"\x1b[" not in raw  # no ANSI colour codes in JSON lines
    assert b"s3cr3t-value" not in raw  # never an argument value
    lines = access_lines(log)
    tool_lines = [line for line in lines if line["method"] == "tools/call"]
    assert len(tool_lines) == len(answers)  # one line per call, never two
    assert [line["outcome"] for line in tool_lines] == [
        "completed", "completed", "completed", "failed", "refused", "refused", "completed", "refused",
    ]  # fmt: skip
    assert [line["agent"] for line in tool_lines] == ["alice"] * 6 + ["bob"] * 2
    assert tool_lines[7]["reason"] == "rate_limited"
    for answer, line in zip(answers, tool_lines, strict=True):
        receipt = receipt_of(answer)
        assert (line["call_id"], line["evidence_session_id"], line["seq"]) == (
            receipt["call_id"],
            receipt["evidence_session_id"],
            receipt["seq"],
        )
    first = tool_lines[0]
    assert (first["server"], first["tool"], first["reason"]) == ("work", "echo", None)
    assert 0 < first["upstream_ms"] <= first["duration_ms"]
    assert tool_lines[4]["reason"] == "unknown_tool" and tool_lines[4]["upstream_ms"] is None
    assert [line["outcome"] for line in lines if line["method"] == "prompts/get"] == ["refused"]


async def test_the_access_log_can_be_turned_off_while_metrics_still_count(
    tmp_path: Path, holding_upstream: HoldingUpstream
) -> None:
    config = write_config(tmp_path / "gateway.toml", holding_upstream.url, "access_log = false")
    log = tmp_path / "gateway.log"
    async with (
        httpx.AsyncClient(timeout=30) as http,
        bastion_serve(config, tmp_path / "data", log) as (_, url),
    ):
        await traffic(http, url)
        samples = await scrape(http, url)
    assert access_lines(log) == []
    # metrics_agents defaults to 0: no agent value at all (an empty label is no label to Prometheus).
    echo = {"server": "work", "tool": "echo", "agent": ""}
    assert value(samples, "bastion_tool_calls_total", **echo, outcome="completed", reason="") == 3
