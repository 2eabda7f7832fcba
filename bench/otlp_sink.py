"""A loopback OTLP/HTTP trace receiver for the benchmark: it counts what a traced Bastion exports.

    .venv/bin/python bench/otlp_sink.py  # prints "LISTENING http://127.0.0.1:PORT"

``POST /v1/traces`` takes an ``ExportTraceServiceRequest`` (protobuf), counts its spans and answers
200 as a collector would; ``GET /count`` answers ``{"requests": N, "spans": M}``. It runs as its own
process (``run.py --tracing-too``), so decoding the spans costs neither Bastion nor the load
generator CPU. A body that does not decode answers 400 and is counted under ``"rejected"``: the
figure says so rather than hide an exporter that sends something else.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_lock = threading.Lock()
_counts = {"requests": 0, "spans": 0, "rejected": 0}


def _spans(body: bytes) -> int:
    request = ExportTraceServiceRequest.FromString(body)
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


class _Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector serves the exporter's session

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        try:
            spans = _spans(body) if self.path == "/v1/traces" else None
        except DecodeError:
            spans = None
        with _lock:
            if spans is None:
                _counts["rejected"] += 1
            else:
                _counts["requests"] += 1
                _counts["spans"] += spans
        self._answer(200 if spans is not None else 400, b"", "application/x-protobuf")

    def do_GET(self) -> None:
        if self.path != "/count":
            self._answer(404, b"", "text/plain")
            return
        with _lock:
            body = json.dumps(_counts).encode()
        self._answer(200, body, "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    print(f"LISTENING http://127.0.0.1:{server.server_port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # SIGTERM (run.py's stop) ends it without a word
        server.serve_forever()


if __name__ == "__main__":
    main()
