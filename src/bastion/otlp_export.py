"""OTLP/HTTP export of this gateway's spans, encoded straight to protobuf bytes (issue #25: cost).

The SDK's encoder builds a protobuf message object per span, per attribute and per status
before serialising them (about 15 µs a span here, most of a traced call's export CPU). The
wire format of ``ExportTraceServiceRequest`` (``opentelemetry/proto/trace/v1/trace.proto``) is
small, so :func:`encode_trace_request` writes it directly: the same request, field for field
(a test parses both and compares). Spans with events or links (Bastion's never have them) go
through the SDK's encoder. Runs in the batch processor's export thread, never on a call's path.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

from bastion.trace_spans import SCOPE, CallSpan, spans_of

__all__ = ["LeanSpanExporter", "encode_trace_request"]

logger = logging.getLogger(__name__)

_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_DOUBLE = struct.Struct("<d")
# Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, and with it SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK.
_FLAGS_LOCAL_PARENT = _FIXED32.pack(0x100)
_FLAGS_REMOTE_PARENT = _FIXED32.pack(0x300)


def _varint_slow(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 as protobuf writes it: ten bytes, two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Every varint below 2**14 (lengths, keys, kinds, codes), made once: most fields need no loop.
_SMALL = tuple(_varint_slow(n) for n in range(1 << 14))


def _varint(value: int) -> bytes:
    return _SMALL[value] if 0 <= value < 16384 else _varint_slow(value)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    size = len(payload)
    return _SMALL[number << 3 | 2] + (_SMALL[size] if size < 16384 else _varint_slow(size)) + payload


def _any_value(value: Any) -> bytes:
    if isinstance(value, str):
        return _field(1, value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(7, value)
    if isinstance(value, Sequence):
        return _field(5, b"".join(_field(1, _any_value(item)) for item in value))
    if isinstance(value, Mapping):
        return _field(6, _attributes(value, 1))
    raise TypeError(f"attribute value of type {type(value).__name__}")


#: Fields made once: an attribute's key (``KeyValue.key``) and a step's name (``Span.name``) are
#: a few dozen names; bounded, so names from elsewhere cannot grow it without end.
_KEYS: dict[str, bytes] = {}
_NAMES: dict[str, bytes] = {}
_KEPT = 1_024


def _cached(cache: dict[str, bytes], number: int, text: str) -> bytes:
    field = cache.get(text)
    if field is None:
        field = _field(number, text.encode())
        if len(cache) < _KEPT:
            cache[text] = field
    return field


def _attributes(attributes: Mapping[str, Any] | None, number: int) -> bytes:
    """``KeyValue`` fields under ``number``; a short string value (most are) written inline."""
    if not attributes:
        return b""
    tag = _SMALL[number << 3 | 2]
    out = []
    for key, value in attributes.items():
        if type(value) is str and len(value) < 4_000:  # at most 16,000 bytes: every size is in _SMALL
            raw = value.encode()
            any_value = b"\x0a" + _SMALL[len(raw)] + raw
        else:
            any_value = _any_value(value)
        pair = (_KEYS.get(key) or _cached(_KEYS, 1, key)) + b"\x12" + _varint(len(any_value)) + any_value
        out.append(tag + _varint(len(pair)) + pair)
    return b"".join(out)


#: ``Span.status`` without a message, by code (UNSET, OK, ERROR).
_STATUS = tuple(_field(15, b"\x18" + _SMALL[code]) for code in range(3))
_KIND_FIELD = {kind: b"\x30" + _SMALL[number] for kind, number in _KIND.items()}


def _status(code: int, description: str | None) -> bytes:
    if description:
        return _field(15, _field(2, description.encode()) + b"\x18" + _SMALL[code])
    return _STATUS[code]


def _trace_state(trace_state: Mapping[str, str] | None) -> bytes:
    return _field(3, ",".join(f"{k}={v}" for k, v in trace_state.items()).encode()) if trace_state else b""


def _span(span: ReadableSpan) -> bytes:
    context = span.get_span_context()
    assert context is not None
    parent = span.parent
    status = span.status
    body = b"".join(
        (
            b"\x0a\x10",
            context.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            context.span_id.to_bytes(8, "big"),
            _trace_state(context.trace_state),
            b"" if parent is None else b"\x22\x08" + parent.span_id.to_bytes(8, "big"),
            _field(5, span.name.encode()),
            _KIND_FIELD[span.kind],
            b"\x39",
            _FIXED64.pack(span.start_time or 0),
            b"\x41",
            _FIXED64.pack(span.end_time or 0),
            _attributes(span.attributes, 9),
            b"\x50" + _varint(span.dropped_attributes) if span.dropped_attributes else b"",
            _status(status.status_code.value, status.description),
            b"\x85\x01",
            _FLAGS_REMOTE_PARENT if parent is not None and parent.is_remote else _FLAGS_LOCAL_PARENT,
        )
    )
    return _field(2, body)


_INTERNAL = _KIND_FIELD[SpanKind.INTERNAL]
_STEP_ERROR = 2  # StatusCode.ERROR


def _call(call: CallSpan) -> bytes:
    """A call's span and its steps (``trace_spans``), as :func:`_span` writes each of them."""
    context, parent = call.context, call.parent
    trace = b"\x0a\x10" + context.trace_id.to_bytes(16, "big") + b"\x12\x08"
    state = _trace_state(context.trace_state)
    status = call.status
    spans = [
        _field(
            2,
            b"".join(
                (
                    trace,
                    context.span_id.to_bytes(8, "big"),
                    state,
                    b"" if parent is None else b"\x22\x08" + parent.span_id.to_bytes(8, "big"),
                    _field(5, call.name.encode()),
                    _KIND_FIELD[call.kind],
                    b"\x39",
                    _FIXED64.pack(call.start_time),
                    b"\x41",
                    _FIXED64.pack(call.end_time or 0),
                    _attributes(call.attributes, 9),
                    b"\x50" + _varint(call.dropped_attributes) if call.dropped_attributes else b"",
                    _status(status.status_code.value, status.description),
                    b"\x85\x01",
                    _FLAGS_REMOTE_PARENT if parent is not None and parent.is_remote else _FLAGS_LOCAL_PARENT,
                )
            ),
        )
    ]
    for step in call.steps:
        spans.append(
            _field(
                2,
                b"".join(
                    (
                        trace,
                        step.span_id.to_bytes(8, "big"),
                        state,
                        b"\x22\x08",
                        step.parent_span_id.to_bytes(8, "big"),
                        _NAMES.get(step.name) or _cached(_NAMES, 5, step.name),
                        _INTERNAL,
                        b"\x39",
                        _FIXED64.pack(step.start_ns),
                        b"\x41",
                        _FIXED64.pack(step.end_ns),
                        _attributes(step.attributes, 9),
                        _STATUS[0] if step.error_type is None else _status(_STEP_ERROR, step.error_type),
                        b"\x85\x01",
                        _FLAGS_LOCAL_PARENT,
                    )
                ),
            )
        )
    return b"".join(spans)


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return _field(1, b"")
    body = _field(1, scope.name.encode())
    if scope.version:
        body += _field(2, scope.version.encode())
    return _field(1, body + _attributes(scope.attributes, 3))


def encode_trace_request(spans: Sequence[ReadableSpan | CallSpan]) -> bytes:
    """The serialised ``ExportTraceServiceRequest`` of ``spans`` (a call: its span, then its
    steps), grouped by resource, then scope."""
    if any(span.events or (not isinstance(span, CallSpan) and span.links) for span in spans):
        encoded: bytes = encode_spans(spans_of(spans)).SerializePartialToString()
        return encoded
    grouped: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    for span in spans:
        by_scope = grouped.setdefault(span.resource, {})
        if isinstance(span, CallSpan):
            by_scope.setdefault(SCOPE, []).append(_call(span))
        else:
            by_scope.setdefault(span.instrumentation_scope or None, []).append(_span(span))
    out = []
    for resource, by_scope in grouped.items():
        body = _field(1, _attributes(resource.attributes, 1))
        for scope, scope_span_bytes in by_scope.items():
            scope_spans = _scope(scope) + b"".join(scope_span_bytes)
            if scope is not None and scope.schema_url:
                scope_spans += _field(3, scope.schema_url.encode())
            body += _field(2, scope_spans)
        if resource.schema_url:
            body += _field(3, resource.schema_url.encode())
        out.append(_field(1, body))
    return b"".join(out)


class LeanSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter (its endpoint, headers, timeout, compression and retries),
    sending requests :func:`encode_trace_request` encoded."""

    def export(self, spans: Sequence[ReadableSpan | CallSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            data = encode_trace_request(spans)
        except Exception as exc:  # a batch that cannot be encoded is dropped, never raised into the SDK
            logger.error("span batch not encoded: %s", type(exc).__name__)
            return SpanExportResult.FAILURE
        limit = getattr(self, "_max_request_size", None)
        if isinstance(limit, int) and len(data) > limit:
            logger.warning("span batch dropped: %d bytes over the request limit %d", len(data), limit)
            return SpanExportResult.FAILURE
        result = self._client.export(data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE
