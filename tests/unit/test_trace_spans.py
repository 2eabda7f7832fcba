"""A governed request's span as Bastion records it (trace_spans.py, tracing.py; issue #25 cost).

The call span is Bastion's own, not the SDK's: these tests hold it to what the SDK's span does
where an operator would notice (the sampler, the ``OTEL_*`` attribute limits, parents and
ids), and hold a call handed to the exporter whole (one item, the call with its steps) to the
request the SDK's encoder writes for the same spans, parsed with ``opentelemetry-proto``.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import StatusCode, get_current_span

from bastion.otlp_export import encode_trace_request
from bastion.trace_spans import CallSpan, spans_of
from bastion.tracing import (
    NO_SPAN,
    Tracing,
    child_span,
    inject_meta,
    note_authentication,
    record_contents,
    set_outcome,
)

CLIENT = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "vendor=1,other=x"}


class _Kept(SpanProcessor):
    def __init__(self) -> None:
        self.items: list[Any] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.items.append(span)


def _tracing(*, whole_calls: bool = True, **provider: Any) -> tuple[Tracing, _Kept]:
    kept = _Kept()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "bastion"}), **provider)
    tracer_provider.add_span_processor(kept)
    return Tracing(tracer_provider, kept, whole_calls=whole_calls), kept


def _governed_call(tracing: Tracing) -> dict[str, Any]:
    """A tool call's spans as call.py makes them; the params that went upstream."""
    note_authentication(1)
    with tracing.call_span("tools/call", CLIENT, {"mcp.method.name": "tools/call"}) as span:
        with child_span(tracing, "bastion.decision") as step:
            step.set_attribute("bastion.reason", "granted")
        with tracing.child("bastion.upstream", current=True):
            sent = inject_meta({"name": "echo", "_meta": dict(CLIENT)})
            with child_span(tracing, "bastion.nested"):  # a step begun while the upstream step is current
                pass
        with pytest.raises(ValueError), child_span(tracing, "bastion.outcome"):
            raise ValueError("s3cr3t-value")
        span.update_name("tools/call work__echo")
        span.set_attribute("bastion.long", "é𝄞" * 2_500)  # past the encoder's inline string size
        set_outcome(
            span, "error", "upstream_unavailable", {"bastion.evidence_seq": 3, "bastion.agent": "alice"}
        )
    return sent


def test_a_call_goes_to_the_exporter_whole_and_encodes_as_the_sdk_encodes_its_spans() -> None:
    """One item per call; its span and its steps (authentication first) with the parents, ids,
    statuses and attributes the SDK's spans have; the bytes parse to the SDK encoder's request."""
    tracing, kept = _tracing()
    sent = _governed_call(tracing)
    [call] = kept.items
    assert isinstance(call, CallSpan)
    spans = spans_of(kept.items)
    by_name = {span.name: span for span in spans}
    assert list(by_name) == [
        "tools/call work__echo",
        "bastion.authentication",
        "bastion.decision",
        "bastion.nested",
        "bastion.upstream",
        "bastion.outcome",
    ]
    root, upstream = by_name["tools/call work__echo"], by_name["bastion.upstream"]
    assert (
        root.parent is not None and root.parent.is_remote and format(root.parent.span_id, "016x") == "b" * 16
    )
    assert format(root.context.trace_id, "032x") == "a" * 32
    assert dict(root.context.trace_state) == {"vendor": "1", "other": "x"}
    for name in ("bastion.authentication", "bastion.decision", "bastion.upstream", "bastion.outcome"):
        parent = by_name[name].parent
        assert parent is not None and parent.span_id == root.context.span_id
    nested_parent = by_name["bastion.nested"].parent
    assert nested_parent is not None and nested_parent.span_id == upstream.context.span_id
    assert sent["_meta"]["traceparent"] == f"00-{'a' * 32}-{format(upstream.context.span_id, '016x')}-01"
    assert sent["_meta"]["tracestate"] == "vendor=1,other=x"
    assert (root.status.status_code, root.status.description) == (StatusCode.ERROR, None)
    outcome = by_name["bastion.outcome"].status
    assert (outcome.status_code, outcome.description) == (StatusCode.ERROR, "ValueError")
    assert root.attributes == {
        "mcp.method.name": "tools/call",
        "bastion.evidence_seq": 3,
        "bastion.long": "é𝄞" * 2_500,
        "bastion.agent": "alice",
        "bastion.outcome": "error",
        "bastion.reason": "upstream_unavailable",
        "error.type": "upstream_unavailable",
    }
    assert len({span.context.span_id for span in spans}) == len(spans)
    ours = ExportTraceServiceRequest.FromString(encode_trace_request(kept.items))
    assert ours == encode_spans(spans)
    assert b"s3cr3t-value" not in encode_trace_request(kept.items)


def test_a_call_for_any_other_processor_is_the_sdks_spans_one_by_one() -> None:
    tracing, kept = _tracing(whole_calls=False)
    _governed_call(tracing)
    assert len(kept.items) == 6 and all(isinstance(span, ReadableSpan) for span in kept.items)


def test_the_sampler_decides_as_it_does_for_an_sdk_span() -> None:
    """Unsampled: nothing recorded or exported, no step made, the context goes upstream unsampled."""
    tracing, kept = _tracing(sampler=ALWAYS_OFF)
    with tracing.call_span("tools/call", CLIENT, {}) as span:
        assert not span.is_recording()
        assert tracing.child("bastion.decision") is NO_SPAN
        record_contents("gen_ai.tool.call.arguments", {"text": "x"})
        sent = inject_meta({"name": "echo"})
    assert kept.items == []
    assert (
        sent["_meta"]["traceparent"] == f"00-{'a' * 32}-{format(span.get_span_context().span_id, '016x')}-00"
    )
    # The default (parent based): a client's unsampled parent is not sampled here either.
    tracing, kept = _tracing(sampler=ParentBased(TraceIdRatioBased(1.0)))
    with tracing.call_span("tools/call", {"traceparent": CLIENT["traceparent"][:-2] + "00"}, {}) as span:
        assert not span.is_recording()
    with tracing.call_span("tools/call", None, {}) as span:  # a root of its own: sampled
        assert span.is_recording() and span.get_span_context().trace_flags.sampled
        assert get_current_span() is span
    assert len(kept.items) == 1


def test_attribute_values_and_counts_keep_the_otel_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` cuts an ``audit_contents`` value (README); a count
    over ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` drops the oldest and says how many were dropped."""
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "8")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    tracing, kept = _tracing()
    with tracing.call_span("tools/call", None, {"mcp.method.name": "tools/call"}):
        record_contents("gen_ai.tool.call.arguments", {"text": "a long argument"})
        set_outcome(get_current_span(), "completed", "", {"bastion.agent": "alice"})
    [root] = spans_of(kept.items)
    assert root.attributes == {
        "gen_ai.tool.call.arguments": '{"text":',
        "bastion.agent": "alice",
        "bastion.outcome": "complete",
    }
    assert root.dropped_attributes == 1
    assert ExportTraceServiceRequest.FromString(encode_trace_request(kept.items)) == encode_spans([root])


def test_a_step_that_ends_after_its_call_is_exported_on_its_own() -> None:
    tracing, kept = _tracing()
    with tracing.call_span("tools/call", None, {}) as span:
        late = tracing.child("bastion.answer")
    with late:
        pass
    call, step = kept.items
    assert isinstance(call, CallSpan) and call.steps == []
    assert isinstance(step, ReadableSpan) and step.parent is not None
    assert step.parent.span_id == span.get_span_context().span_id
