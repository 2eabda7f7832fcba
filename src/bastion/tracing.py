"""OpenTelemetry traces of governed calls (DESIGN section 11, issue #25): off unless configured.

On when the standard variables ask for an OTLP exporter: ``OTEL_TRACES_EXPORTER=otlp``, or an
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` without
``OTEL_TRACES_EXPORTER=none``; ``OTEL_SDK_DISABLED=true`` turns it off. Spans go out over
OTLP/HTTP (protobuf), batched, with the exporter's own ``OTEL_EXPORTER_OTLP_*`` settings
(headers, timeout), ``OTEL_SERVICE_NAME`` (default ``bastion``), ``OTEL_RESOURCE_ATTRIBUTES``
and ``OTEL_TRACES_SAMPLER``. The tracer provider is this gateway's own (never the global one),
so two gateways in one process keep their spans apart.

A client's W3C trace context is the parent of a call's span: ``traceparent``/``tracestate`` in
the request's ``params._meta`` (where the MCP SDK puts it, ``mcp/shared/_otel.py``), else in
the HTTP request headers (:class:`TraceContextAsgi` makes them the request's context). The
gateway's own span context goes upstream in ``_meta`` (every upstream) and, for an HTTP
upstream, in the request headers too (:func:`inject_headers`).

Attributes follow the OpenTelemetry semantic conventions for MCP where they exist
(``mcp.method.name``, ``gen_ai.tool.name``, ``gen_ai.operation.name``, ``jsonrpc.request.id``,
``error.type``) plus Bastion's own (``bastion.*``). Never a credential; an argument or a result
value only for a server with the ``audit_contents`` opt-in (``gen_ai.tool.call.arguments`` and
``gen_ai.tool.call.result``, JSON, cut at ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` when set).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "NO_SPAN",
    "TraceContextAsgi",
    "Tracing",
    "child_span",
    "inject_headers",
    "inject_meta",
    "note_authentication",
    "record_contents",
    "set_outcome",
    "trace_id_of_current",
]

logger = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent/tracestate, stateless
_TRACE_KEYS = ("traceparent", "tracestate")
#: When this request authenticated (start and end, ns since the epoch): the call span that
#: follows in the same context takes it as its authentication step (:func:`note_authentication`).
_AUTHENTICATED: ContextVar[tuple[int, int] | None] = ContextVar("bastion_authenticated", default=None)
#: A context manager that is no span (tracing off): reusable, it holds no state.
NO_SPAN: AbstractContextManager[None] = nullcontext()


def _wanted(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return "otlp" in {name.strip() for name in exporter.split(",")}
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(endpoint)


_SCOPE = InstrumentationScope("bastion")
_UNSET = Status(StatusCode.UNSET)  # immutable: shared by every step that did not fail


#: The batch processor's sizes unless ``OTEL_BSP_*`` set them: a traced call is seven spans, so
#: the SDK's 2,048-span queue holds under 300 calls (the rest are dropped while the export
#: thread is behind), and each export of 512 spans is a request: fewer, larger ones cost less.
_QUEUE_SPANS = 16_384
_BATCH_SPANS = 2_048


def _batch_sizes(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``(max_queue_size, max_export_batch_size)`` for the batch processor: ``None`` where an
    ``OTEL_BSP_*`` variable decides (the SDK reads it, and warns about a bad one)."""
    queue = None if environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else _QUEUE_SPANS
    if environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
        return queue, None
    if queue is not None:
        return queue, _BATCH_SPANS
    try:  # never above the queue the variable sets (the SDK refuses a batch larger than it)
        return None, min(_BATCH_SPANS, int(environ["OTEL_BSP_MAX_QUEUE_SIZE"]))
    except ValueError:
        return None, None


class _Resource(Resource):
    """A resource that hashes once: the OTLP encoder groups every exported span by its resource,
    and the SDK's hash serialises the attributes to JSON each time (a third of a span's export
    CPU). The attributes are immutable, so the hash is too."""

    def __init__(self, attributes: Any, schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)

    def __hash__(self) -> int:
        return self._hash


class Tracing:
    """This gateway's tracer, exporting over OTLP/HTTP.

    The call span is the SDK's; a step of the call (:meth:`child`) is cheaper: its times are
    taken on the way in and out and the finished span goes straight to this gateway's batch
    processor, without the SDK's per-span sampler, locks and processor fan-out (a step is
    sampled with its call). Only a step that is ``current=True`` (its context goes upstream)
    is made the current context while it runs."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor) -> None:
        self._provider = provider
        self._processor = processor  # the one processor of this provider (batched export)
        self._resource = provider.resource
        self._ids = RandomIdGenerator()
        self.tracer: Tracer = provider.get_tracer("bastion")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Tracing | None:
        """The tracer the ``OTEL_*`` variables configure, or ``None`` (tracing off)."""
        env = os.environ if environ is None else environ
        if not _wanted(env):
            return None
        protocol = (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
        ).strip()
        if protocol and protocol != "http/protobuf":
            logger.warning("OTLP protocol %s is not supported; traces go over http/protobuf", protocol)
        from bastion.otlp_export import LeanSpanExporter  # the OTLP exporter's import is slow: on demand

        attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "bastion"}
        created = Resource.create(attributes)
        provider = TracerProvider(resource=_Resource(created.attributes, created.schema_url))
        # The endpoint from the variables given (the exporter itself reads the process's own for
        # the rest: headers, timeout, compression; the batch processor its OTEL_BSP_*).
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
        queue, batch = _batch_sizes(os.environ)
        processor = BatchSpanProcessor(
            LeanSpanExporter(endpoint=endpoint or None), max_queue_size=queue, max_export_batch_size=batch
        )
        provider.add_span_processor(processor)
        return cls(provider, processor)

    def shutdown(self) -> None:
        """Export what is still batched, then stop (blocking: run it in a worker thread)."""
        self._provider.shutdown()

    @contextmanager
    def call_span(self, name: str, meta: Any, attributes: dict[str, Any]) -> Iterator[Span]:
        """The span of one governed request, current while it runs, parented by the client's context."""
        parent = _context_from_meta(meta)
        authenticated = _AUTHENTICATED.get()
        if authenticated is not None:
            _AUTHENTICATED.set(None)  # one call's: a later request in this context authenticates anew
        with self.tracer.start_as_current_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            # Its outcome sets its status (set_outcome): the SDK's own would hold the exception's
            # text, which may quote an argument or be an upstream's words.
            set_status_on_exception=False,
            start_time=None if authenticated is None else authenticated[0],  # the call began there
        ) as span:
            if authenticated is not None and span.get_span_context().trace_flags.sampled:
                step = _Step(self, "bastion.authentication", span.get_span_context(), False)
                step.start_ns = authenticated[0]
                self._export(step, authenticated[1], None)
            yield span

    def child(self, name: str, *, current: bool = False) -> AbstractContextManager[Any]:
        """A child span of the current one (a step of the call), the current context while it
        runs only when ``current`` (a step whose context is passed on); nothing when the current
        span is not sampled."""
        parent = get_current_span().get_span_context()
        if not parent.trace_flags.sampled:
            return NO_SPAN
        return _Step(self, name, parent, current)

    def _export(self, step: _Step, end_ns: int, failed: BaseException | None) -> None:
        status = _UNSET
        if failed is not None:  # the type only: an exception's text may carry a value
            status = Status(StatusCode.ERROR, type(failed).__name__)
        self._processor.on_end(
            ReadableSpan(
                step.name,
                context=step.context,
                parent=step.parent,
                resource=self._resource,
                attributes=step.attributes,
                kind=SpanKind.INTERNAL,
                status=status,
                start_time=step.start_ns,
                end_time=end_ns,
                instrumentation_scope=_SCOPE,
            )
        )


class _Step:
    """One step of a call: a child span, exported when it ends (:meth:`Tracing.child`)."""

    __slots__ = ("_current", "_token", "_tracing", "attributes", "context", "name", "parent", "start_ns")

    def __init__(self, tracing: Tracing, name: str, parent: SpanContext, current: bool) -> None:
        self._tracing, self.name, self.parent, self._current = tracing, name, parent, current
        self.context = SpanContext(
            parent.trace_id,
            tracing._ids.generate_span_id(),
            is_remote=False,
            trace_flags=parent.trace_flags,
            trace_state=parent.trace_state,
        )
        self.attributes: dict[str, Any] | None = None
        self._token: object | None = None
        self.start_ns = 0

    def set_attribute(self, key: str, value: Any) -> None:
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value

    def __enter__(self) -> _Step:
        if self._current:
            self._token = otel_context.attach(set_span_in_context(NonRecordingSpan(self.context)))
        self.start_ns = time.time_ns()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        end_ns = time.time_ns()
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        self._tracing._export(self, end_ns, exc)


def child_span(tracing: Tracing | None, name: str) -> AbstractContextManager[Any]:
    """``tracing.child(name)``, or nothing when tracing is off (no cost beyond this call)."""
    return NO_SPAN if tracing is None else tracing.child(name)


def note_authentication(started_ns: int) -> None:
    """This request authenticated from ``started_ns`` until now: the call span that follows (in
    this context) gets it as a child step (tracing on only; the caller checks)."""
    _AUTHENTICATED.set((started_ns, time.time_ns()))


def record_contents(key: str, value: Any) -> None:
    """A value itself on the current (call) span, as JSON under ``key``: only for a server whose
    ``audit_contents`` opt-in says so (the caller checks it); a no-op when nothing is traced."""
    span = get_current_span()
    if span.is_recording():
        span.set_attribute(key, json.dumps(value, separators=(",", ":"), default=str))


def set_outcome(span: Span, outcome: str, reason: str, attributes: dict[str, Any] | None = None) -> None:
    """The outcome attributes (with ``attributes``, set in the same one call: the SDK locks and
    checks each call) and, for a failure, the error status."""
    attributes = {} if attributes is None else attributes
    attributes["bastion.outcome"] = outcome
    if reason:
        attributes["bastion.reason"] = reason
    failed = outcome not in ("completed", "input_required")
    if failed:
        attributes["error.type"] = reason or outcome
    span.set_attributes(attributes)
    if failed:
        span.set_status(Status(StatusCode.ERROR))


def _context_from_meta(meta: Any) -> Context | None:
    """The client's trace context from ``_meta``, else ``None`` (the request's current context)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("traceparent"), str):
        return None
    carrier = {key: meta[key] for key in _TRACE_KEYS if isinstance(meta.get(key), str)}
    ctx = _PROPAGATOR.extract(carrier)
    return ctx if get_current_span(ctx).get_span_context().is_valid else None


def inject_meta(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the current span context in ``_meta`` (replacing the client's)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    if not carrier:
        return params
    meta = params.get("_meta")
    kept = {k: v for k, v in meta.items() if k not in _TRACE_KEYS} if isinstance(meta, dict) else {}
    return {**params, "_meta": {**kept, **carrier}}


def inject_headers(headers: MutableMapping[str, str]) -> None:
    """Add the current span context to an upstream HTTP request's headers (nothing when none)."""
    _PROPAGATOR.inject(headers)


def trace_id_of_current() -> str | None:
    """The current span's trace id in hex, for the access line and exemplars, or ``None``."""
    span_context = get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


class TraceContextAsgi:
    """Makes an HTTP request's ``traceparent``/``tracestate`` headers its OTel context (tracing on)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        carrier: dict[str, str] = {}
        if scope["type"] == "http":
            for key, value in scope["headers"]:
                if key in (b"traceparent", b"tracestate"):
                    carrier[key.decode("latin-1")] = value.decode("latin-1")
        if "traceparent" not in carrier:
            await self._app(scope, receive, send)
            return
        token = otel_context.attach(_PROPAGATOR.extract(carrier))
        try:
            await self._app(scope, receive, send)
        finally:
            otel_context.detach(token)
