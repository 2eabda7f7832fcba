"""The pieces of issue #25 that need no process: when tracing is on, the agent label bound,
and the trace context handed upstream (``tracing.py``, ``metrics.py``)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, get_current_span

from bastion.metrics import OTHER_AGENT, AgentLabels
from bastion.tracing import NO_SPAN, Tracing, _batch_sizes, inject_meta, set_outcome

ENDPOINT = "http://127.0.0.1:9/"  # never contacted: nothing is exported in these tests


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
    ],
)
def test_tracing_is_off_unless_the_otel_variables_ask_for_an_otlp_exporter(
    environ: dict[str, str], on: bool
) -> None:
    tracing = Tracing.from_environment(environ)
    try:
        assert (tracing is not None) is on
    finally:
        if tracing is not None:
            tracing.shutdown()


def test_the_agent_label_is_empty_when_off_and_bounded_when_on() -> None:
    labels = AgentLabels()
    assert labels.label("alice", 0) == ""
    assert [labels.label(agent, 2) for agent in ("alice", "bob", "carol", "alice", "dave", "bob")] == [
        "alice", "bob", OTHER_AGENT, "alice", OTHER_AGENT, "bob",
    ]  # fmt: skip


def test_the_gateway_span_replaces_the_clients_trace_context_in_meta_and_nothing_without_one() -> None:
    client = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=v", "other": 1}
    params = {"name": "echo", "_meta": client}
    assert inject_meta(params) is params  # no current span: the params go as they are
    tracing = Tracing.from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT})
    assert tracing is not None
    try:
        with tracing.call_span("tools/call", client, {}) as span:
            sent = inject_meta(params)
            context = span.get_span_context()
    finally:
        tracing.shutdown()
    assert format(context.trace_id, "032x") == "a" * 32  # the client's context was the parent
    meta = sent["_meta"]
    assert meta["other"] == 1
    assert meta["tracestate"] == "k=v"  # the client's tracestate carries on (W3C)
    assert meta["traceparent"] == f"00-{'a' * 32}-{format(context.span_id, '016x')}-01"
    assert params["_meta"] is client and client["traceparent"].endswith("b" * 16 + "-01")  # not mutated


def test_a_step_is_a_child_of_the_call_span_and_a_failure_names_its_type_never_its_text() -> None:
    """``Tracing.child``: the step span goes to the processor with the call's trace, its parent
    and its times; an exception's type is its status, never its message (which may carry a value);
    an unsampled call makes no step at all."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exported)
    provider.add_span_processor(processor)
    tracing = Tracing(provider, processor)
    with tracing.call_span("tools/call", None, {}) as span:
        with tracing.child("bastion.decision"):
            pass
        with pytest.raises(ValueError), tracing.child("bastion.upstream", current=True):
            assert get_current_span().get_span_context().span_id != span.get_span_context().span_id
            raise ValueError("s3cr3t-value")
        assert get_current_span() is span  # the current step was detached
    by_name = {s.name: s for s in exported.get_finished_spans()}
    decision, upstream, call = by_name["bastion.decision"], by_name["bastion.upstream"], by_name["tools/call"]
    for step in (decision, upstream):
        assert step.parent is not None and step.parent.span_id == call.context.span_id
        assert step.context.trace_id == call.context.trace_id
        assert call.start_time <= step.start_time <= step.end_time <= call.end_time
    assert decision.status.status_code is StatusCode.UNSET
    assert (upstream.status.status_code, upstream.status.description) == (StatusCode.ERROR, "ValueError")
    assert "s3cr3t-value" not in repr([s.to_json() for s in exported.get_finished_spans()])
    with trace.use_span(trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)):
        assert tracing.child("bastion.decision") is NO_SPAN  # nothing sampled, nothing made


def test_a_call_span_that_ends_in_an_exception_never_carries_its_text() -> None:
    """A refusal or an upstream error raised through the call span: its text (which may quote an
    argument, or be an upstream's own words) is in no span; the outcome sets the status."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exported)
    provider.add_span_processor(processor)
    tracing = Tracing(provider, processor)
    with pytest.raises(ValueError), tracing.call_span("tools/call", None, {}) as span:
        try:
            raise ValueError("'s3cr3t-value' is not of type 'integer'")
        finally:
            set_outcome(span, "refused", "invalid_arguments")
    (call,) = exported.get_finished_spans()
    assert (call.status.status_code, call.status.description) == (StatusCode.ERROR, None)
    assert call.attributes is not None and call.attributes["error.type"] == "invalid_arguments"
    assert "s3cr3t-value" not in repr(call.to_json())


@pytest.mark.parametrize(
    ("environ", "sizes"),
    [
        ({}, (4_096, 512)),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "100"}, (None, 100)),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "50000"}, (None, 512)),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}, (4_096, None)),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "many"}, (None, None)),
    ],
)
def test_the_batch_processor_holds_thousands_of_calls_unless_the_otel_variables_size_it(
    environ: dict[str, str], sizes: tuple[int | None, int | None]
) -> None:
    """Queue and export batch default to sizes in calls (each with its steps); ``OTEL_BSP_*`` win."""
    assert _batch_sizes(environ) == sizes
