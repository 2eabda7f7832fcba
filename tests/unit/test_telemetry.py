"""The pieces of issue #25 that need no process: when tracing is on, the agent label bound,
and the trace context handed upstream (``tracing.py``, ``metrics.py``)."""

from __future__ import annotations

import pytest

from bastion.metrics import OTHER_AGENT, AgentLabels
from bastion.tracing import Tracing, inject_meta

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
