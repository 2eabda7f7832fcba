"""Grant rate limits reach reads, gets and completions (issue 9), official Python client, session era.

The upstreams are ``tests/e2e/surface_upstream.py`` behind ``tests/e2e/test_surface_e2e.py``'s
gateway. Bob gets one more grant: ``doc://readme`` and the ``greet`` prompt of ``a`` at two uses a
minute; a broader grant never lifts a narrower one's limit.
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
