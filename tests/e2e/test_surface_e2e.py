"""Resources, prompts and completion through Bastion (issue 9), official Python client in both eras.

Two upstreams collide on purpose (``tests/e2e/surface_upstream.py``): ``a`` over stdio and
``b`` over HTTP offer the same URIs and prompt names. Alice may use everything; bob's
grants hide ``doc://secret`` and the ``internal`` prompt.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged
from mcp.types import (
    PromptReference,
    ResourceTemplateReference,
    TextContent,
    TextResourceContents,
)

from bastion.app import create_app
from bastion.auth.bearer import hash_token
from bastion.gateway import RuntimeOptions
from bastion.policy.load import snapshot_from_mapping
from bastion.versions import LATEST_HANDSHAKE_VERSION
from tests.e2e.conftest import TOKENS, RunningGateway, _stop
from tests.support.loopback import serve_on_loopback

pytestmark = pytest.mark.anyio

MODES = ["legacy", "auto"]


@pytest.fixture(scope="module")
def http_surface() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.surface_upstream", "--label", "b", "--http"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("LISTENING "), line
    yield line.split()[1]
    _stop(process)


def _config(http_url: str, *, grants: bool = True) -> dict[str, Any]:
    config: dict[str, Any] = {
        "servers": {
            "a": {"command": sys.executable, "args": ["-m", "tests.e2e.surface_upstream", "--label", "a"]},
            "b": {"url": http_url},
        },
        "agents": {name: {"token_sha256": hash_token(token)} for name, token in TOKENS.items()},
    }
    if grants:
        config["grants"] = [
            {"agent": "alice", "servers": ["a", "b"], "tools": ["*"], "resources": ["*"], "prompts": ["*"]},
            {
                "agent": "bob",
                "servers": ["a", "b"],
                "resources": ["doc://readme", "doc://pages/*", "doc://notes/*"],
            },
            {"agent": "bob", "servers": ["a", "b"], "prompts": ["greet"]},
        ]
    return config


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[RunningGateway]:
    snapshot = snapshot_from_mapping(config, source=None, version="t")
    app = create_app(snapshot, RuntimeOptions(data_dir=tmp_path / "data"))
    async with serve_on_loopback(app) as url:
        yield RunningGateway(url, app.state.gateway, tmp_path)


@pytest.fixture
async def gateway(tmp_path: Path, http_surface: str) -> AsyncIterator[RunningGateway]:
    async with _gateway(tmp_path, _config(http_surface)) as running:
        yield running


def _text(contents: Any) -> str:
    assert isinstance(contents, TextResourceContents)
    return contents.text


@pytest.mark.parametrize("mode", MODES)
async def test_colliding_uris_are_listed_apart_and_read_from_their_own_upstream(
    gateway: RunningGateway, mode: str
) -> None:
    """The same upstream URI from two servers is two gateway URIs, each read from its own server."""
    async with gateway.client(mode=mode) as client:
        uris: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            page = await client.list_resources(cursor=cursor, cache_mode="refresh")
            uris += [str(r.uri) for r in page.resources]
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        for label in ("a", "b"):
            read = await client.read_resource(f"bastion://{label}/doc://readme")
            assert _text(read.contents[0]) == f"readme of {label}"
            assert str(read.contents[0].uri) == f"bastion://{label}/doc://readme"
    # Three resources an upstream, two a page: a page ends where an upstream's page ends with a
    # cursor, so a's last page and b's first make one: [a a] [a b b] [b].
    assert pages == 3
    assert sorted(uris) == sorted(
        f"bastion://{label}/doc://{name}" for label in "ab" for name in ("readme", "secret", "notes/1")
    )


@pytest.mark.parametrize("mode", MODES)
async def test_templates_prompts_and_completion_route_to_their_server(
    gateway: RunningGateway, mode: str
) -> None:
    """Templates are mapped, prompts namespaced, and completions reach the server the ref names."""
    async with gateway.client(mode=mode) as client:
        capabilities = client.server_capabilities
        assert capabilities.resources is not None and capabilities.prompts is not None
        assert capabilities.completions is not None
        templates = await client.list_resource_templates(cache_mode="refresh")
        assert sorted(t.uri_template for t in templates.resource_templates) == [
            "bastion://a/doc://pages/{page}",
            "bastion://b/doc://pages/{page}",
        ]
        page = await client.read_resource("bastion://b/doc://pages/7")
        assert _text(page.contents[0]) == "page 7 of b"
        prompts = await client.list_prompts(cache_mode="refresh")
        assert sorted(p.name for p in prompts.prompts) == [
            "a__greet",
            "a__internal",
            "b__greet",
            "b__internal",
        ]
        got = await client.get_prompt("a__greet", {"name": "ada"})
        content = got.messages[0].content
        assert isinstance(content, TextContent) and content.text == "hello ada from a"
        done = await client.complete(
            PromptReference(type="ref/prompt", name="b__greet"), {"name": "name", "value": "b-a"}
        )
        assert done.completion.values == ["b-alpha"]
        done = await client.complete(
            ResourceTemplateReference(type="ref/resource", uri="bastion://a/doc://pages/{page}"),
            {"name": "page", "value": ""},
        )
        assert done.completion.values == ["a-alpha", "a-beta"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_grant_hides_a_resource_and_a_prompt_as_if_unknown(
    gateway: RunningGateway, mode: str
) -> None:
    """Bob's lists leave out what his grants do not cover; reading it is refused as unknown, and audited."""
    async with gateway.client("bob", mode=mode) as client:
        listed: list[str] = []
        cursor: str | None = None
        while True:
            page = await client.list_resources(cursor=cursor, cache_mode="refresh")
            listed += [str(r.uri) for r in page.resources]
            if (cursor := page.next_cursor) is None:
                break
        assert not any(uri.endswith("doc://secret") for uri in listed)
        with pytest.raises(MCPError) as hidden:
            await client.read_resource("bastion://a/doc://secret")
        with pytest.raises(MCPError) as unknown:
            await client.read_resource("bastion://a/doc://nothing-here")
        prompts = await client.list_prompts(cache_mode="refresh")
        assert sorted(p.name for p in prompts.prompts) == ["a__greet", "b__greet"]
        with pytest.raises(MCPError) as hidden_prompt:
            await client.get_prompt("a__internal")
    assert hidden.value.error.code == unknown.value.error.code == -32002
    assert hidden.value.error.message == "Resource not found: bastion://a/doc://secret"
    assert unknown.value.error.message == "Resource not found: bastion://a/doc://nothing-here"
    assert hidden_prompt.value.error.code == -32602
    assert hidden_prompt.value.error.message == "Unknown prompt: a__internal"
    refusals = [e for e in _entries_of(gateway.tmp_path, "bob") if e["reason"] == "grant_denied"]
    assert {(e["server"], e["tool"]) for e in refusals} == {
        ("a", "doc://secret"),
        ("a", "doc://nothing-here"),
        ("a", "internal"),
    }
    assert all(e["args_digest"] and e["decision"] == "deny" for e in refusals)
    reads = [e for e in _entries_of(gateway.tmp_path, "bob") if e["event"] == "completed"]
    assert all("result_digest" in e["detail"] and "of a" not in str(e) for e in reads)


def _entries_of(tmp_path: Path, agent: str) -> list[dict[str, Any]]:
    """Every audit entry of ``agent`` (read-only, straight from the SQLite file)."""
    uri = f"file:{tmp_path / 'data' / 'bastion.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute(
            "SELECT entry FROM entries WHERE json_extract(entry, '$.agent') = ?", (agent,)
        ).fetchall()
    return [orjson.loads(row[0]) for row in rows]


async def test_capabilities_are_advertised_only_where_an_upstream_offers_them(
    tmp_path: Path, http_surface: str
) -> None:
    """An agent whose grants reach no resources or prompts is not offered them."""
    config = _config(http_surface)
    config["grants"].append({"agent": "carol", "servers": ["a"], "tools": ["*"]})
    config["agents"]["carol"] = {"token_sha256": hash_token(TOKENS["alice"] + "c")}
    async with _gateway(tmp_path, config) as running:
        caps = running.gateway.router.capabilities_for(_principal("carol"), LATEST_HANDSHAKE_VERSION)
        assert "resources" not in caps and "prompts" not in caps and "completions" not in caps
        caps = running.gateway.router.capabilities_for(_principal("alice"), LATEST_HANDSHAKE_VERSION)
        assert {"resources", "prompts", "completions"} <= set(caps)


def _principal(agent: str) -> Any:
    from bastion.auth.principal import Principal
    from bastion.ids import AgentId

    return Principal(agent=AgentId(agent))


@pytest.mark.parametrize("mode", MODES)
async def test_a_transparent_server_keeps_its_uris_and_prompt_names_beside_a_sessionless_upstream(
    tmp_path: Path, http_surface: str, mode: str
) -> None:
    """Transparent ``a`` keeps ``doc://readme`` and ``greet``; ``b``, pinned sessionless, stays mapped."""
    config = _config(http_surface, grants=False)
    config["servers"]["a"]["transparent"] = True
    config["servers"]["b"]["era"] = "sessionless"
    async with _gateway(tmp_path, config) as running, running.client(mode=mode) as client:
        templates = await client.list_resource_templates(cache_mode="refresh")
        assert sorted(t.uri_template for t in templates.resource_templates) == [
            "bastion://b/doc://pages/{page}",
            "doc://pages/{page}",
        ]
        mine = await client.read_resource("doc://readme")
        theirs = await client.read_resource("bastion://b/doc://readme")
        assert (_text(mine.contents[0]), _text(theirs.contents[0])) == ("readme of a", "readme of b")
        assert str(mine.contents[0].uri) == "doc://readme"
        prompts = await client.list_prompts(cache_mode="refresh")
        assert sorted(p.name for p in prompts.prompts) == ["b__greet", "b__internal", "greet", "internal"]
        got = await client.get_prompt("greet", {"name": "ada"})
    content = got.messages[0].content
    assert isinstance(content, TextContent) and content.text == "hello ada from a"


async def test_an_upstream_prompts_list_changed_reaches_the_client_and_the_catalog_grows(
    tmp_path: Path, http_surface: str
) -> None:
    """A shared stdio upstream adds a prompt at run time: the client is told; the new prompt is listed
    and served. (With a process per client session, issue 22, a prompt one client's process adds is
    that process's alone and the gateway-wide catalog does not follow it.)"""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/prompts/list_changed":
            changed.set()

    config = _config(http_surface)
    config["servers"]["a"]["scope"] = "shared"
    async with _gateway(tmp_path, config) as gateway, gateway.client(message_handler=on_message) as client:
        assert client.server_capabilities.prompts is not None
        assert client.server_capabilities.prompts.list_changed is True
        grown = await client.call_tool("a__grow_prompt", {"name": "fresh"})
        assert not grown.is_error, grown
        with anyio.fail_after(15):
            await changed.wait()
        listed = {p.name for p in (await client.list_prompts(cache_mode="refresh")).prompts}
        got = await client.get_prompt("a__fresh")
    assert "a__fresh" in listed and "b__fresh" not in listed
    content = got.messages[0].content
    assert isinstance(content, TextContent) and content.text == "fresh of a"


async def test_a_prompts_list_changed_reaches_a_sessionless_listen_stream(gateway: RunningGateway) -> None:
    """A 2026 client listening for promptsListChanged hears an upstream's prompts/list_changed."""
    async with (
        gateway.client(mode="auto") as client,
        client.listen(prompts_list_changed=True) as subscription,
    ):
        assert subscription.honored.prompts_list_changed is True
        await client.call_tool("b__grow_prompt", {"name": "later"})
        with anyio.fail_after(15):
            event = await subscription.__anext__()
        listed = {p.name for p in (await client.list_prompts(cache_mode="refresh")).prompts}
    assert isinstance(event, PromptsListChanged)
    assert "b__later" in listed
