"""OpenTelemetry traces of governed calls, end to end (issue #25, DESIGN section 11).

A real ``bastion serve`` configured by the standard ``OTEL_*`` variables exports over OTLP/HTTP
to a real receiver in this test (a loopback HTTP server decoding each export with
``opentelemetry-proto``). Its upstream (``tests/e2e/recording_upstream.py``) prints the trace
context every ``tools/call`` reached it with. A client's ``traceparent`` (HTTP header, or
``params._meta``) is the parent of the call's span; the upstream sees the gateway's own span.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import secrets
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import orjson
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from bastion.auth.bearer import hash_token
from tests.e2e.conftest import TOKENS
from tests.e2e.test_evidence_e2e import auth, call_params, receipt_of
from tests.e2e.test_shared_evidence_crash import bastion_serve
from tests.e2e.test_telemetry_e2e import access_lines, write_config
from tests.e2e.test_transport_rules import MODERN_META, modern_headers, rpc

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
EXPORT_TIMEOUT_S = 30.0
SECRET_TEXT = "s3cr3t-argument-value"


# ---------------------------------------------------------------- an OTLP/HTTP receiver


@dataclass
class OtlpReceiver:
    """Every span exported to ``POST /v1/traces``, decoded with opentelemetry-proto."""

    url: str
    spans: list[tuple[dict[str, Any], Span]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [span for _, span in self.spans if span.name == name]

    def resources(self) -> list[dict[str, Any]]:
        with self.lock:
            return [resource for resource, _ in self.spans]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def attributes(span: Span) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in span.attributes}


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with receiver.lock:
                for resource_spans in request.resource_spans:
                    resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans.extend((resource, span) for span in scope_spans.spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# ---------------------------------------------------------------- the recording upstream


@dataclass
class RecordingUpstream:
    process: anyio.abc.Process
    url: str
    stdout: BufferedByteReceiveStream

    async def next_seen(self) -> dict[str, Any]:
        with anyio.fail_after(START_TIMEOUT_S):
            line = await self.stdout.receive_until(b"\n", 65536)
        word, _, rest = line.decode().partition(" ")
        assert word == "SEEN", line
        seen: dict[str, Any] = json.loads(rest)
        return seen


@pytest.fixture
async def recording_upstream(tmp_path: Path) -> AsyncIterator[RecordingUpstream]:
    env = {**os.environ, "BASTION_COUNTER_FILE": str(tmp_path / "counter.log")}
    process = await anyio.open_process(
        [sys.executable, "-m", "tests.e2e.recording_upstream"], cwd=REPO, env=env
    )
    try:
        assert process.stdout is not None
        stdout = BufferedByteReceiveStream(process.stdout)
        with anyio.fail_after(START_TIMEOUT_S):
            line = await stdout.receive_until(b"\n", 4096)
        words = line.decode().split()
        assert words[0] == "LISTENING", line
        yield RecordingUpstream(process, words[1], stdout)
    finally:
        with anyio.CancelScope(shield=True):
            process.terminate()
            with anyio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


# ---------------------------------------------------------------- helpers


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


def ids_of(value: str) -> tuple[str, str]:
    """(trace id, parent span id) of a traceparent value."""
    _, trace_id, span_id, _ = value.split("-")
    return trace_id, span_id


async def call(
    http: httpx.AsyncClient,
    url: str,
    name: str,
    arguments: dict[str, Any],
    *,
    header: dict[str, str] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params = call_params(name, arguments, meta={**MODERN_META, **(meta or {})})
    response = await http.post(
        url,
        headers={**modern_headers("tools/call", name), **auth("alice"), **(header or {})},
        json=rpc("tools/call", params),
    )
    answer: dict[str, Any] = response.json()
    return answer


async def wait_for_spans(receiver: OtlpReceiver, name: str, count: int) -> list[Span]:
    with anyio.fail_after(EXPORT_TIMEOUT_S):
        while len(found := receiver.named(name)) < count:
            await anyio.sleep(0.05)
    return found


# ---------------------------------------------------------------- the test


async def test_a_call_span_is_parented_by_the_client_and_its_context_reaches_the_upstream(
    tmp_path: Path, recording_upstream: RecordingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    header_trace, header_parent = secrets.token_hex(16), secrets.token_hex(8)
    meta_trace, meta_parent = secrets.token_hex(16), secrets.token_hex(8)
    config = write_config(tmp_path / "gateway.toml", recording_upstream.url, "")
    log = tmp_path / "gateway.log"
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "bastion-under-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        async with (
            httpx.AsyncClient(timeout=30) as http,
            bastion_serve(config, tmp_path / "data", log) as (_, url),
        ):
            by_header = await call(
                http,
                url,
                "work__echo",
                {"text": SECRET_TEXT},
                header={"traceparent": traceparent(header_trace, header_parent), "tracestate": "vendor=1"},
            )
            seen_header = await recording_upstream.next_seen()
            by_meta = await call(
                http,
                url,
                "work__echo",
                {"text": "b"},
                meta={"traceparent": traceparent(meta_trace, meta_parent)},
            )
            seen_meta = await recording_upstream.next_seen()
            refused = await call(http, url, "work__nope", {})
            calls = await wait_for_spans(receiver, "tools/call work__echo", 2)
            [unknown] = await wait_for_spans(receiver, "tools/call (unknown)", 1)
            await wait_for_spans(receiver, "bastion.upstream", 2)
            await wait_for_spans(receiver, "bastion.outcome", 2)
            response = await http.get(
                url.removesuffix("/mcp") + "/metrics", headers={"accept": "application/openmetrics-text"}
            )

    assert "result" in by_header and "result" in by_meta and "error" in refused
    by_trace = {span.trace_id.hex(): span for span in calls}
    first, second = by_trace[header_trace], by_trace[meta_trace]
    assert first.parent_span_id.hex() == header_parent  # the client's header is the parent
    assert second.parent_span_id.hex() == meta_parent  # the client's _meta is the parent
    assert first.kind == Span.SpanKind.SPAN_KIND_SERVER
    assert unknown.trace_id.hex() not in (header_trace, meta_trace)  # no context: a trace of its own

    receipt = receipt_of(by_header)
    attrs = attributes(first)
    assert attrs["mcp.method.name"] == "tools/call"
    assert attrs["gen_ai.tool.name"] == "work__echo"
    assert attrs["bastion.server"] == "work" and attrs["bastion.agent"] == "alice"
    assert attrs["bastion.outcome"] == "completed"
    assert attrs["bastion.call_id"] == receipt["call_id"]
    assert attrs["bastion.evidence_session_id"] == receipt["evidence_session_id"]
    assert attrs["bastion.evidence_seq"] == receipt["seq"]
    unknown_attrs = attributes(unknown)
    assert (unknown_attrs["bastion.outcome"], unknown_attrs["error.type"]) == ("refused", "unknown_tool")
    assert unknown.status.code == unknown.status.STATUS_CODE_ERROR

    # Child spans of the call: decision, admission-free read-only path, upstream, outcome.
    children = {
        span.name: span
        for _, span in receiver.spans
        if span.trace_id == first.trace_id and span.parent_span_id == first.span_id
    }
    assert {"bastion.authentication", "bastion.decision", "bastion.upstream", "bastion.outcome"} <= set(
        children
    )
    assert children["bastion.authentication"].start_time_unix_nano == first.start_time_unix_nano
    upstream_span = children["bastion.upstream"]
    # The upstream saw the gateway's upstream span as its parent: header and _meta alike.
    assert ids_of(seen_header["traceparent"]) == (header_trace, upstream_span.span_id.hex())
    assert ids_of(seen_header["meta"]["traceparent"]) == (header_trace, upstream_span.span_id.hex())
    assert ids_of(seen_meta["meta"]["traceparent"])[0] == meta_trace
    assert ids_of(seen_meta["traceparent"])[0] == meta_trace
    assert meta_parent not in seen_meta["meta"]["traceparent"]  # Bastion's own span, not the client's

    # Never an argument value, a credential or a result in a span.
    exported = repr([(resource, span) for resource, span in receiver.spans])
    assert SECRET_TEXT not in exported and "alice-token" not in exported
    assert {resource.get("service.name") for resource in receiver.resources()} == {"bastion-under-test"}

    # The access line names the trace; OpenMetrics carries the trace id as an exemplar.
    [line] = [line for line in access_lines(log) if line.get("call_id") == receipt["call_id"]]
    assert line["trace_id"] == header_trace
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = [
        sample.exemplar.labels["trace_id"]
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "bastion_tool_calls_total" and sample.exemplar is not None
    ]
    assert exemplars and set(exemplars) <= {span.trace_id.hex() for _, span in receiver.spans}
    assert orjson.dumps(exemplars)


async def test_a_stdio_upstream_receives_the_gateways_span_context_in_meta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stdio upstream has no headers: Bastion's span context reaches it in ``params._meta``."""
    client_trace, client_parent = secrets.token_hex(16), secrets.token_hex(8)
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[servers.meta]\ncommand = "{sys.executable}"\nargs = ["-m", "tests.e2e.meta_stdio_upstream"]\n'
        f'cwd = "{REPO}"\n\n'
        + "".join(f'[agents.{n}]\ntoken_sha256 = "{hash_token(t)}"\n' for n, t in TOKENS.items())
    )
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        async with (
            httpx.AsyncClient(timeout=30) as http,
            bastion_serve(config, tmp_path / "data", tmp_path / "gateway.log") as (_, url),
        ):
            answer = await call(
                http,
                url,
                "meta__seen_meta",
                {},
                header={"traceparent": traceparent(client_trace, client_parent)},
            )
            [upstream_span] = await wait_for_spans(receiver, "bastion.upstream", 1)
    assert "result" in answer, answer
    seen = json.loads(answer["result"]["content"][0]["text"])
    assert ids_of(seen["traceparent"]) == (client_trace, upstream_span.span_id.hex())
    assert upstream_span.trace_id.hex() == client_trace


async def test_argument_and_result_values_enter_a_span_only_with_the_servers_audit_contents_opt_in(
    tmp_path: Path, recording_upstream: RecordingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other test shows no value by default; with ``audit_contents = true`` the call span
    carries the arguments and the result (OTel's opt-in ``gen_ai.tool.call.*``), and the call
    has an answer step of its own."""
    config = write_config(tmp_path / "gateway.toml", recording_upstream.url, "")
    server_line = f'url = "{recording_upstream.url}"\n'
    config.write_text(config.read_text().replace(server_line, server_line + "audit_contents = true\n"))
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        async with (
            httpx.AsyncClient(timeout=30) as http,
            bastion_serve(config, tmp_path / "data", tmp_path / "gateway.log") as (_, url),
        ):
            answer = await call(http, url, "work__echo", {"text": SECRET_TEXT})
            [span] = await wait_for_spans(receiver, "tools/call work__echo", 1)
            [answer_span] = await wait_for_spans(receiver, "bastion.answer", 1)
    assert "result" in answer, answer
    attrs = attributes(span)
    assert json.loads(attrs["gen_ai.tool.call.arguments"]) == {"text": SECRET_TEXT}
    result = json.loads(attrs["gen_ai.tool.call.result"])
    assert result["content"] == answer["result"]["content"]
    assert (answer_span.trace_id, answer_span.parent_span_id) == (span.trace_id, span.span_id)
    assert "alice-token" not in repr(receiver.spans)  # a credential never, opt-in or not
