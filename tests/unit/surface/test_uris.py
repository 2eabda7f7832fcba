"""Property tests of the resource URI map and the list cursor (issue 9, ``surface/uris.py``, ``pages.py``)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.errors import InvalidParams
from bastion.surface.pages import decode_cursor, encode_cursor
from bastion.surface.uris import GATEWAY_URI_PREFIX, UriTarget, expose_uri, resolve_uri

# The snapshot's namespace rule: letters, digits, '-' and '_', never '/'.
namespaces = st.from_regex(r"\A[a-zA-Z0-9_-]{1,32}\Z")
uris = st.text(min_size=0, max_size=80)
variables = st.from_regex(r"\A[a-z]{1,8}\Z")


@given(namespaces, uris)
def test_a_mapped_uri_reads_back_to_its_namespace_and_uri(namespace: str, uri: str) -> None:
    """Every (namespace, URI) pair, whatever the URI holds, maps to a URI that resolves back to it."""
    exposed = expose_uri(namespace, uri, transparent=False)
    assert exposed is not None
    assert resolve_uri(exposed) == UriTarget(namespace, uri)


@given(uris)
def test_a_transparent_uri_reads_back_verbatim_or_is_left_out(uri: str) -> None:
    """The transparent server's URIs are shown as they are, except those that would read as mapped ones."""
    exposed = expose_uri("t", uri, transparent=True)
    if uri.startswith(GATEWAY_URI_PREFIX):
        assert exposed is None
    else:
        assert exposed == uri and resolve_uri(exposed) == UriTarget(None, uri)


@given(st.tuples(namespaces, uris, st.booleans()), st.tuples(namespaces, uris, st.booleans()))
def test_two_different_sources_never_meet(
    first: tuple[str, str, bool], second: tuple[str, str, bool]
) -> None:
    """Distinct (server, URI) pairs never share an exposed URI (at most one server is transparent)."""

    def source(namespace: str, uri: str, transparent: bool) -> tuple[str | None, str]:
        return (None if transparent else namespace, uri)  # the one transparent server

    one, two = (
        expose_uri(first[0], first[1], transparent=first[2]),
        expose_uri(*second[:2], transparent=second[2]),
    )
    if one is not None and two is not None and source(*first) != source(*second):
        assert one != two


def _expand(template: str, values: dict[str, str]) -> str:
    return re.sub(r"\{([a-z]+)\}", lambda m: values[m.group(1)], template)


@given(
    namespaces,
    st.lists(st.tuples(st.from_regex(r"\A[a-z:/._-]{0,12}\Z"), variables), min_size=1, max_size=4),
    st.text(alphabet="abc123-_.", max_size=10),
)
def test_expanding_a_mapped_template_gives_the_mapped_expansion(
    namespace: str, parts: list[tuple[str, str]], value: str
) -> None:
    """A client that fills in a mapped template reaches the URI the upstream's own template gives."""
    template = "".join(f"{literal}{{{name}}}" for literal, name in parts)
    values = {name: value for _, name in parts}
    mapped = expose_uri(namespace, template, transparent=False)
    assert mapped is not None
    assert resolve_uri(_expand(mapped, values)) == UriTarget(namespace, _expand(template, values))


def test_a_gateway_uri_without_a_namespace_resolves_to_nothing() -> None:
    """``bastion://`` with no namespace, or no slash after it, names no server."""
    assert resolve_uri("bastion://") is None
    assert resolve_uri("bastion://ns") is None
    assert resolve_uri("bastion:///x") is None


@given(st.sampled_from(["a", "b", "notes_"]), st.one_of(st.none(), st.text(max_size=40)))
def test_a_cursor_reads_back_to_its_server_and_upstream_cursor(server: str, cursor: str | None) -> None:
    """The gateway cursor carries the server and the upstream's own cursor, whatever it holds."""
    assert decode_cursor(encode_cursor(server, cursor), ["a", "b", "notes_"]) == (server, cursor)


@pytest.mark.parametrize("cursor", ["", "not base64!", 7, encode_cursor("gone", None), "bnVsbA"])
def test_a_cursor_the_gateway_did_not_make_is_invalid_params(cursor: object) -> None:
    """A forged cursor, or one naming a server no longer configured, is InvalidParams."""
    with pytest.raises(InvalidParams):
        decode_cursor(cursor, ["a", "b"])
