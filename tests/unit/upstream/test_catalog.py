"""The tool surface's naming and collision rule (upstream/catalog.py): a name is never shadowed."""

from __future__ import annotations

from bastion.upstream.catalog import Collision, ToolEntry, all_collisions, exposed_name, merge_catalog


def _entry(server: str, namespace: str, tool: str, *, transparent: bool = False) -> ToolEntry:
    name = exposed_name(namespace, "__", tool, transparent=transparent)
    return ToolEntry(name, server, namespace, tool, {"name": name})


def test_namespaces_notes_and_notes_underscore_collide_on_notes___x() -> None:
    """``notes``+``_x`` and ``notes_``+``x`` are both ``notes___x``: the second is refused, never routed."""
    first, second = _entry("a", "notes", "_x"), _entry("b", "notes_", "x")
    assert first.exposed_name == second.exposed_name == "notes___x"
    merged, collisions = merge_catalog({"a": [first], "b": [second]}, {})
    assert merged["notes___x"].server == "a"
    assert collisions == [Collision("notes___x", holder="a", refused="b")]


def test_a_transparent_server_keeps_its_own_names() -> None:
    """A transparent server's tool is exposed under its own name, with no prefix."""
    assert exposed_name("fixture", "__", "test_simple_text", transparent=True) == "test_simple_text"
    assert exposed_name("fixture", "__", "test_simple_text", transparent=False) == "fixture__test_simple_text"


def test_a_list_changed_never_takes_a_name_from_its_holder() -> None:
    """A refreshed list that introduces a held name is refused, even from the server configured first."""
    holder = _entry("b", "x", "a__b", transparent=True)  # exposes "a__b"
    previous = {"a__b": holder}
    newcomer = _entry("a", "a", "b")  # also "a__b", configured first
    merged, collisions = merge_catalog({"a": [newcomer], "b": [holder]}, previous)
    assert merged["a__b"].server == "b"
    assert collisions == [Collision("a__b", holder="b", refused="a")]


def test_a_collision_clears_when_the_holder_drops_the_name() -> None:
    """Once the holder no longer offers the name, the other server's tool joins the surface."""
    newcomer = _entry("a", "a", "b")
    merged, collisions = merge_catalog(
        {"a": [newcomer], "b": []}, {"a__b": _entry("b", "x", "a__b", transparent=True)}
    )
    assert merged["a__b"].server == "a" and collisions == []


def test_all_collisions_finds_every_shared_name_at_start() -> None:
    """The start-time check reports a name two servers offer, whichever listed first."""
    assert all_collisions({"a": [_entry("a", "notes", "_x")], "b": [_entry("b", "notes_", "x")]}) == [
        Collision("notes___x", holder="a", refused="b")
    ]
    assert all_collisions({"a": [_entry("a", "notes", "x")], "b": [_entry("b", "notes_", "x")]}) == []


def test_declares_param_headers_only_for_a_valid_x_mcp_header_schema() -> None:
    """Only a schema with a valid x-mcp-header parameter makes the front door check Mcp-Param-* headers."""

    def tool(schema: object) -> ToolEntry:
        return ToolEntry("t__x", "t", "t", "x", {"name": "x", "inputSchema": schema})

    annotated = {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}
    plain = {"type": "object", "properties": {"region": {"type": "string"}}}
    invalid = {"type": "object", "properties": {"region": {"type": "object", "x-mcp-header": "Region"}}}
    assert tool(annotated).declares_param_headers is True
    assert tool(plain).declares_param_headers is False
    assert tool(invalid).declares_param_headers is False
    assert ToolEntry("t__x", "t", "t", "x", {"name": "x"}).declares_param_headers is False
