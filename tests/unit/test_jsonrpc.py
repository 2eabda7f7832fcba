"""Parsing one JSON-RPC message: every malformed shape is a typed error."""

from __future__ import annotations

import json
import math

import pytest

from bastion.errors import InvalidRequest, ParseError
from bastion.transport.jsonrpc import (
    Notification,
    Request,
    Response,
    decode_body,
    dumps,
    error_message,
    parse_message,
)


def test_request_notification_and_response_are_told_apart() -> None:
    """A request has an id, a notification none, a response a result or an error."""
    assert parse_message({"jsonrpc": "2.0", "id": 1, "method": "ping"}) == Request(1, "ping", {})
    assert parse_message({"jsonrpc": "2.0", "method": "n", "params": None}) == Notification("n", {})
    assert parse_message({"jsonrpc": "2.0", "id": "a", "result": {}}) == Response("a", {}, None)


@pytest.mark.parametrize("body", [b"", b"{", b"[1,", b"\xff", b"1" * 5000])
def test_non_json_is_a_parse_error(body: bytes) -> None:
    """Bodies that are not JSON raise ParseError."""
    with pytest.raises(ParseError):
        decode_body(body)


def test_deep_nesting_is_a_parse_error_not_a_crash() -> None:
    """A pathologically nested body is refused as a parse error."""
    with pytest.raises(ParseError):
        decode_body(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}},
        {"jsonrpc": "2.0", "id": 1, "result": []},
        {"jsonrpc": "2.0", "id": 1.5, "method": "x"},
        {"jsonrpc": "2.0", "id": 1, "method": ""},
        {"id": 1, "method": "x"},
    ],
)
def test_invalid_shapes(message: object) -> None:
    """Shapes that are JSON but not JSON-RPC raise InvalidRequest."""
    with pytest.raises(InvalidRequest):
        parse_message(message)


def test_error_rendering_carries_reason() -> None:
    """A rendered error has the class's code, message and stable reason."""
    rendered = error_message(None, InvalidRequest())
    assert rendered["id"] is None
    assert rendered["error"]["code"] == -32600
    assert rendered["error"]["data"] == {"reason": "invalid_request"}


def _deep(depth: int) -> object:
    value: object = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', "lone_surrogate"),
        (b'{"jsonrpc":"2.0","id":1,"method":"\\udc00"}', "lone_surrogate"),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\ud800x"}}', "lone_surrogate"),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","extra":NaN}}', "not_finite"),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","x":-Infinity}}', "not_finite"),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":'
            + b'{"a":' * 324
            + b"1"
            + b"}" * 324
            + b"}}",
            "too_deep",
        ),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":"x"}}', "meta_not_an_object"),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":[1]}}', "meta_not_an_object"),
    ],
)
def test_values_that_cannot_cross_are_invalid_requests(body: bytes, problem: str) -> None:
    """A lone surrogate, NaN/Infinity, deep nesting or a non-object _meta is -32600 with its problem."""
    with pytest.raises(InvalidRequest) as caught:
        parse_message(decode_body(body))
    assert caught.value.data["problem"] == problem
    assert error_message(None, caught.value)["error"]["code"] == -32600


def test_moderate_nesting_is_accepted() -> None:
    """Arguments nested well within the bound are parsed as usual."""
    message = parse_message({"jsonrpc": "2.0", "id": 1, "method": "m", "params": {"a": _deep(90)}})
    assert isinstance(message, Request)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a":[1,-2,3.5,1e-7,-0.0,true,null,"\\u00e9t\\u00e9"]}',
        b"18446744073709551616",  # past u64: orjson alone would read a float
        b"-9223372036854775809",  # past i64 the other way
        b'{"n":123456789012345678901234567890}',
        b"1e400",  # the stdlib reads infinity; wire_problem then refuses it
        b'{"x":NaN}',
        b'"\\ud800"',
        b'\xef\xbb\xbf{"bom":1}',
        b'{"a":1,"a":2}',
    ],
)
def test_decode_body_reads_what_json_loads_reads(body: bytes) -> None:
    """decode_body gives the very value (type included) that json.loads gives, on the fast path or not."""
    decoded, expected = decode_body(body), json.loads(body)
    if isinstance(expected, float) and not math.isfinite(expected):
        assert decoded == expected and type(decoded) is float
        return
    assert repr(decoded) == repr(expected)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "result": {"text": "été ☃", "n": 2**70, "f": 0.1}},
        {"jsonrpc": "2.0", "id": 1, "result": {"k": {1: "non-string key"}}},
    ],
)
def test_dumps_writes_compact_utf8_json_for_every_value(message: dict[str, object]) -> None:
    """dumps writes compact UTF-8 JSON whose value equals the message, orjson or not."""
    written = dumps(message)
    assert b": " not in written and b", " not in written
    assert json.loads(written) == json.loads(json.dumps(message))


def test_dumps_still_refuses_a_lone_surrogate() -> None:
    """A string with a lone surrogate has no UTF-8 form: dumps raises rather than writing garbage."""
    with pytest.raises(UnicodeEncodeError):
        dumps({"jsonrpc": "2.0", "id": 1, "result": {"t": "\ud800"}})
