"""The traced Bastion of ``run.py --tracing-too``: its receiver, its environment, its figures (issue #25).

Every Bastion the benchmark starts runs with the ``OTEL_*`` variables of the caller's environment
removed (:func:`untraced_env`), so "tracing off" is off whatever the shell exports; the traced one
gets ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at ``otlp_sink.py`` on loopback, the SDK's default
sampler (every call traced) and batch processor, so it pays for building, encoding and sending every
span. The receiver's span count, read after the rounds, shows the spans were really exported.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

from procs import Child

SINK_READY = re.compile(r"^LISTENING (http://\S+)$")
SINK = Path(__file__).resolve().with_name("otlp_sink.py")


def start_sink(temp: Path, timeout_s: float) -> tuple[Child, str]:
    """``otlp_sink.py`` in its own process, and its base URL (an ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    sink = Child.start(
        "otlp-sink", [sys.executable, str(SINK)], ready=SINK_READY, log_path=temp / "otlp-sink.log",
        timeout_s=timeout_s,
    )  # fmt: skip
    return sink, SINK_READY.match(sink.ready_line).group(1)  # type: ignore[union-attr]


def untraced_env() -> dict[str, str]:
    """This process's environment without any ``OTEL_*`` variable: a Bastion that does not trace."""
    return {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}


def traced_env(endpoint: str) -> dict[str, str]:
    """A Bastion that traces every call and exports it over OTLP/HTTP to ``endpoint``."""
    return dict(untraced_env(), OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="bastion-bench")


def sink_counts(endpoint: str) -> dict[str, int]:
    """What the receiver took so far: export requests, spans, rejected bodies."""
    with urllib.request.urlopen(f"{endpoint}/count", timeout=10) as answer:
        counts: dict[str, int] = json.loads(answer.read())
    return counts


def tracing_ratios(
    off: dict[str, Any], on: dict[str, Any], exported: dict[str, int], calls_made: int
) -> dict[str, float]:
    """Tracing on against off in the same rounds: throughput, CPU per call, latency, spans exported.

    ``calls_made``: every call sent to the traced Bastion, warm-ups included (what its spans cover).
    """
    o, t = off["headline"], on["headline"]
    spans = exported.get("spans", 0)
    return {
        "throughput_ratio": round(t["calls_per_s"] / o["calls_per_s"], 3),
        "cpu_ratio": round(t["bastion_cpu_per_call_us"] / o["bastion_cpu_per_call_us"], 3),
        "added_bastion_cpu_per_call_us": round(
            t["bastion_cpu_per_call_us"] - o["bastion_cpu_per_call_us"], 1
        ),
        "added_p50_ms": round(t["serial_p50_ms"] - o["serial_p50_ms"], 3),
        "spans_exported": spans,
        "spans_per_call": round(spans / calls_made, 2) if calls_made else float("nan"),
        "exports_rejected": exported.get("rejected", 0),
    }


def render_tracing(results: dict[str, Any]) -> str:
    r = results["compared_tracing"]
    return (
        f"tracing on (OTLP to a loopback receiver) vs off: CPU per call {r['cpu_ratio']:.3f}x "
        f"({r['added_bastion_cpu_per_call_us']:+.1f} us; target <= 1.1x), throughput "
        f"{r['throughput_ratio']:.3f}x, p50 {r['added_p50_ms']:+.3f} ms; "
        f"{r['spans_exported']:,} spans exported ({r['spans_per_call']:.2f} per call)"
    )
