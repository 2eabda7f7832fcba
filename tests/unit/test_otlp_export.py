"""Bastion's OTLP trace encoder writes the request the SDK's encoder writes (otlp_export.py, #25).

Real SDK spans (a ``TracerProvider`` with a processor that keeps them) are encoded both ways;
our bytes are parsed with ``opentelemetry-proto`` and compared, message for message, with the
SDK's ``encode_spans``.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceState

from bastion.otlp_export import encode_trace_request
from bastion.tracing import Tracing


class _Kept(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _provider(service: str) -> tuple[TracerProvider, _Kept]:
    kept = _Kept()
    provider = TracerProvider(resource=Resource.create({"service.name": service, "bastion.replica": 2}))
    provider.add_span_processor(kept)
    return provider, kept


def _assert_same(spans: list[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest.FromString(encode_trace_request(spans))
    assert ours == encode_spans(spans)


def test_call_spans_and_their_steps_encode_as_the_sdk_encodes_them() -> None:
    """A call span under a remote parent (with a tracestate), its steps (bastion's own spans),
    every attribute type, an error status with and without a description."""
    provider, kept = _provider("bastion")
    tracing = Tracing(provider, kept)
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "value"), ("other", "x")]),
    )
    attributes: dict[str, Any] = {
        "text": "tools/call wörk__echo",
        "flag": True,
        "off": False,
        "count": 300,
        "negative": -5,
        "ratio": 0.25,
        "names": ("a", "b"),
        "numbers": [1, 2, 3],
    }
    with tracing.call_span("tools/call", {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}, {}):
        with tracing.child("bastion.decision") as step:
            step.set_attribute("bastion.reason", "grant_denied")
        try:
            with tracing.child("bastion.upstream", current=True):
                raise ValueError("never in the span: a value")
        except ValueError:
            pass
    tracer = provider.get_tracer("other-scope", "1.2")
    with tracer.start_as_current_span("remote-child", context=set_span_in_context(NonRecordingSpan(remote))):
        pass
    with tracer.start_as_current_span("root", kind=SpanKind.CLIENT, attributes=attributes) as span:
        span.set_status(Status(StatusCode.ERROR, "upstream_unavailable"))
    with tracer.start_as_current_span("ok") as span:
        span.set_status(Status(StatusCode.OK))
    assert len(kept.spans) == 6
    _assert_same(kept.spans)


def test_spans_of_two_resources_and_spans_with_events_encode_as_the_sdk_encodes_them() -> None:
    """Grouped by resource then scope in first-seen order; a span with an event (Bastion makes
    none) goes through the SDK's own encoder and still encodes the same."""
    first, kept_first = _provider("one")
    second, kept_second = _provider("two")
    for provider in (first, second, first):
        with provider.get_tracer("bastion").start_as_current_span("call"):
            pass
    spans = [kept_first.spans[0], kept_second.spans[0], kept_first.spans[1]]
    _assert_same(spans)
    with first.get_tracer("bastion").start_as_current_span("with-event") as span:
        span.add_event("retry", {"attempt": 2})
    _assert_same(kept_first.spans)
