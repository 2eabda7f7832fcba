"""Policy on reads, gets and completions beyond visibility (issue 9), official Python client, session era.

The upstreams are ``tests/e2e/surface_upstream.py`` behind ``tests/e2e/test_surface_e2e.py``'s
gateway. Rate limits: bob gets one more grant, ``doc://readme`` and the ``greet`` prompt of ``a``
at two uses a minute (a broader grant never lifts a narrower one's limit). Contents: a server's
``audit_contents`` opt-in keeps what was read in the audit entry; without it, digests only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import PromptReference

from tests.e2e.test_surface_e2e import _config, _entries_of, _gateway, http_surface

pytestmark = pytest.mark.anyio

__all__ = ["http_surface"]  # the fixture, imported for pytest


async def test_a_grant_rate_limits_reads_and_gets_per_method_and_audits_the_refusal(
    tmp_path: Path, http_surface: str
) -> None:
    """Two reads a minute: the third is refused with rate_limited (audited), while gets and completions
    keep their own buckets; another agent is not limited."""
    config = _config(http_surface)
    config["grants"].append(
        {
            "agent": "bob",
            "servers": ["a"],
            "resources": ["doc://readme"],
            "prompts": ["greet"],
            "rate": "2/minute",
        }
    )
    async with _gateway(tmp_path, config) as gateway:
        async with gateway.client("bob") as client:
            for _ in range(2):
                await client.read_resource("bastion://a/doc://readme")
            with pytest.raises(MCPError) as limited:
                await client.read_resource("bastion://a/doc://readme")
            await client.read_resource("bastion://b/doc://readme")  # another server: not this grant's
            await client.get_prompt("a__greet", {"name": "x"})
            await client.complete(
                PromptReference(type="ref/prompt", name="a__greet"), {"name": "name", "value": "a"}
            )
            await client.get_prompt("a__greet", {"name": "y"})
            with pytest.raises(MCPError) as limited_get:
                await client.get_prompt("a__greet", {"name": "z"})
        async with gateway.client("alice") as other:
            for _ in range(3):
                await other.read_resource("bastion://a/doc://readme")
    assert limited.value.error.code == limited_get.value.error.code == -32033
    refused = [e for e in _entries_of(tmp_path, "bob") if e["event"] == "refused"]
    assert [(e["detail"]["method"], e["reason"], e["tool"]) for e in refused] == [
        ("resources/read", "rate_limited", "doc://readme"),
        ("prompts/get", "rate_limited", "greet"),
    ]


async def test_audit_contents_keeps_what_was_read_only_for_the_server_that_opted_in(
    tmp_path: Path, http_surface: str
) -> None:
    """With ``audit_contents`` on ``a``, its read's entry holds the URI asked and the text answered;
    ``b``'s read keeps digests only."""
    config = _config(http_surface)
    config["servers"]["a"]["audit_contents"] = True
    async with _gateway(tmp_path, config) as gateway, gateway.client("alice") as client:
        await client.read_resource("bastion://a/doc://readme")
        await client.read_resource("bastion://b/doc://readme")
    reads = {
        e["server"]: e["detail"]
        for e in _entries_of(tmp_path, "alice")
        if e["detail"].get("method") == "resources/read"
    }
    assert reads["a"]["params"] == {"uri": "bastion://a/doc://readme"}
    assert reads["a"]["result"]["contents"][0]["text"] == "readme of a"
    assert "params" not in reads["b"] and "result" not in reads["b"]
    assert reads["a"]["result_digest"] and reads["b"]["result_digest"]


async def test_a_grant_arguments_schema_constrains_a_prompts_arguments(
    tmp_path: Path, http_surface: str
) -> None:
    """Bob's prompt grant accepts names of at most five characters: a longer one is refused with
    argument_constraint_failed (the prompt stays listed), audited; a short one is got."""
    config = _config(http_surface)
    config["grants"][2] = {
        "agent": "bob",
        "servers": ["a", "b"],
        "prompts": ["greet"],
        "arguments_schema": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}}},
    }
    async with _gateway(tmp_path, config) as gateway, gateway.client("bob") as client:
        got = await client.get_prompt("a__greet", {"name": "ada"})
        with pytest.raises(MCPError) as refused:
            await client.get_prompt("a__greet", {"name": "adalovelace"})
        listed = [p.name for p in (await client.list_prompts(cache_mode="refresh")).prompts]
    assert got.messages and "a__greet" in listed
    assert refused.value.error.code == -32032
    entries = [e for e in _entries_of(tmp_path, "bob") if e["detail"].get("method") == "prompts/get"]
    assert [(e["event"], e["reason"]) for e in entries] == [
        ("completed", None),
        ("refused", "argument_constraint_failed"),
    ]
