"""JSON-RPC 2.0 message parsing and rendering for the front door (DESIGN section 2, step 1).

Owns: turning a POST body into exactly one typed message, or raising the
typed error that says why not; and rendering results and errors. It never
writes a response itself (``transport/streamable_http.py`` does) and never
interprets MCP methods.

Batches are refused: the 2025-06-18 revision removed them and no supported
revision needs them for correctness.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from bastion.errors import BastionError, InvalidRequest, ParseError
from bastion.wire_value import loads_exact, wire_problem

__all__ = [
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "decode_body",
    "dumps",
    "error_message",
    "parse_message",
    "result_message",
]

RequestId = str | int


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Response:
    """A client's answer to a request the gateway relayed to it."""

    id: RequestId
    result: dict[str, Any] | None
    error: dict[str, Any] | None


Message = Request | Notification | Response


def _valid_id(value: Any) -> bool:
    # JSON-RPC allows null ids only on errors; MCP forbids null request ids. bool is an int subclass.
    return isinstance(value, str | int) and not isinstance(value, bool)


def decode_body(body: bytes) -> Any:
    """The JSON value of ``body``, read exactly as ``json.loads`` reads it (:func:`loads_exact`).

    Raises:
        ParseError: ``body`` is not JSON (deep nesting and huge numbers included).
    """
    try:
        return loads_exact(body)
    except (ValueError, RecursionError) as exc:
        raise ParseError() from exc


def parse_message(decoded: Any) -> Message:
    """One JSON-RPC message from a decoded body.

    Raises:
        InvalidRequest: it is not one valid JSON-RPC 2.0 message.
    """
    if isinstance(decoded, list):
        raise InvalidRequest("Invalid Request: JSON-RPC batches are not supported")
    if not isinstance(decoded, dict):
        raise InvalidRequest("Invalid Request: the body must be a JSON-RPC object")
    if decoded.get("jsonrpc") != "2.0":
        raise InvalidRequest('Invalid Request: "jsonrpc" must be "2.0"')
    # NaN, a lone surrogate or deep nesting cannot be hashed, encoded or relayed (issue #12).
    problem = wire_problem(decoded)
    if problem is not None:
        raise InvalidRequest(f"Invalid Request: the message is not plain JSON ({problem})", problem=problem)
    params = decoded.get("params", {})
    if params is None:
        params = {}
    method = decoded.get("method")
    if method is not None:
        if not isinstance(method, str) or not method:
            raise InvalidRequest('Invalid Request: "method" must be a non-empty string')
        if not isinstance(params, dict):
            raise InvalidRequest('Invalid Request: "params" must be an object')
        if "_meta" in params and not isinstance(params["_meta"], dict):
            raise InvalidRequest(
                'Invalid Request: "params._meta" must be an object', problem="meta_not_an_object"
            )
        if "id" not in decoded:
            return Notification(method, params)
        if not _valid_id(decoded["id"]):
            raise InvalidRequest('Invalid Request: "id" must be a string or an integer')
        return Request(decoded["id"], method, params)
    if "id" in decoded and ("result" in decoded or "error" in decoded):
        if not _valid_id(decoded["id"]):
            raise InvalidRequest('Invalid Request: "id" must be a string or an integer')
        result, error = decoded.get("result"), decoded.get("error")
        if ("result" in decoded) == ("error" in decoded):
            raise InvalidRequest("Invalid Request: a response carries exactly one of result and error")
        if result is not None and not isinstance(result, dict):
            raise InvalidRequest('Invalid Request: "result" must be an object')
        if error is not None and not isinstance(error, dict):
            raise InvalidRequest('Invalid Request: "error" must be an object')
        return Response(decoded["id"], result, error)
    raise InvalidRequest('Invalid Request: missing "method"')


def dumps(message: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON: orjson, or the stdlib for what orjson refuses (integers past 64 bits,
    non-string keys), which then raises as before for what has no UTF-8 form (a lone surrogate)."""
    try:
        return orjson.dumps(message)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def result_message(request_id: RequestId, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_message(request_id: RequestId | None, error: BastionError | dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC error; a :class:`BastionError` is rendered with its code, message and data."""
    if isinstance(error, BastionError):
        body: dict[str, Any] = {
            "code": error.jsonrpc_code,
            "message": error.message,
            "data": error.error_data(),
        }
    else:
        body = error
    return {"jsonrpc": "2.0", "id": request_id, "error": body}
