"""CPU per call of the telemetry code alone (issue #25): metrics, the access line, the spans.

    .venv/bin/python bench/telemetry_cost.py [--calls 20000] [--span-calls 5000] [--traced-only]

Instructions per traced call (deterministic where CPU time on a shared machine is noise)::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        .venv/bin/python bench/telemetry_cost.py --traced-only --span-calls 1000  # then 3000
    # (I(3000) - I(1000)) / 2000: start-up cancels out. Another build: its src first on PYTHONPATH.

Runs what ``call.py`` runs per governed call for each part, in this process, and prints CPU
microseconds per call (``time.process_time``, so a loaded machine inflates it less than wall
time): the metrics (``CallTelemetry.tool_call`` with the access line off, then with the agent
label on), the access line (JSON, to a file), and a traced call (the call span, its six steps
as call.py makes them, the ``_meta`` injection) exported over OTLP/HTTP to a sink on loopback, export thread
included (the provider is shut down, so every span is flushed, before the clock stops).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from bastion.call_telemetry import ACCESS_LOGGER, CallTelemetry
from bastion.logs import JsonFormatter
from bastion.metrics import CallMetrics
from bastion.policy.snapshot import GatewaySettings
from bastion.tracing import Tracing, child_span, inject_meta, note_authentication, set_outcome


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def per_call_us(calls: int, one: Callable[[int], None]) -> float:
    started = time.process_time()
    for i in range(calls):
        one(i)
    return (time.process_time() - started) / calls * 1e6


def reporter(telemetry: CallTelemetry) -> Callable[[int], None]:
    in_flight = telemetry.metrics.in_flight_of("tools/call")

    def one(i: int) -> None:
        in_flight.inc()
        in_flight.dec()
        telemetry.tool_call(
            "alice",
            server="tools",
            tool="echo",
            outcome="completed",
            reason="",
            total_s=0.002,
            upstream_s=0.001,
            call_id="call_0",
            execution_id=None,
            evidence_session_id="ev_0",
            seq=i,
        )

    return one


def traced(tracing: Tracing) -> Callable[[int], None]:
    parent = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}

    def one(i: int) -> None:
        note_authentication(time.time_ns())  # as Gateway.authenticate does, tracing on
        with tracing.call_span("tools/call", parent, {"mcp.method.name": "tools/call"}) as span:
            for step in ("bastion.decision", "bastion.admission"):
                with child_span(tracing, step):
                    pass
            with tracing.child("bastion.upstream", current=True):
                inject_meta({"name": "echo", "arguments": {}})
            for step in ("bastion.outcome", "bastion.answer"):
                with child_span(tracing, step):
                    pass
            span.update_name("tools/call tools__echo")
            attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "bastion.evidence_seq": i}
            for key in ("gen_ai.tool.name", "bastion.agent", "bastion.call_id", "bastion.server"):
                attributes[key] = "x"
            set_outcome(span, "completed", "", attributes)  # as call.py's _describe_span

    return one


def traced_cost(calls: int) -> float:
    """CPU µs per traced call, its export (to a loopback sink) included."""
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(calls * 8))
    tracing = Tracing.from_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_port}"}
    )
    assert tracing is not None
    started = time.process_time()
    per_call_us(calls, traced(tracing))
    tracing.shutdown()
    spent = (time.process_time() - started) / calls * 1e6
    sink.shutdown()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--span-calls", type=int, default=5_000)
    parser.add_argument("--traced-only", action="store_true", help="only the traced call (for callgrind)")
    args = parser.parse_args()
    if args.traced_only:
        print(f"traced call (7 spans, exported)     {traced_cost(args.span_calls):8.1f} us/call")
        return
    off, on = GatewaySettings(), GatewaySettings(metrics_agents=5)
    access = logging.getLogger(ACCESS_LOGGER)
    access.propagate = False
    access.setLevel(logging.WARNING)

    def fresh(settings: GatewaySettings) -> Callable[[int], None]:
        return reporter(CallTelemetry(CallMetrics(CollectorRegistry()), lambda: settings))

    metrics = per_call_us(args.calls, fresh(off))
    agents = per_call_us(args.calls, fresh(on))
    with tempfile.TemporaryDirectory() as temp:
        handler = logging.FileHandler(Path(temp) / "access.log")
        handler.setFormatter(JsonFormatter())
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        logged = per_call_us(args.calls, fresh(off))
        access.removeHandler(handler)
        handler.close()
    spans = traced_cost(args.span_calls)
    print(f"metrics (access line off)           {metrics:8.1f} us/call")
    print(f"metrics, agent label on             {agents:8.1f} us/call")
    print(f"metrics + access line (JSON, file)  {logged:8.1f} us/call")
    print(f"traced call (7 spans, exported)     {spans:8.1f} us/call")


if __name__ == "__main__":
    main()
