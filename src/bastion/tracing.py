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
from collections.abc import Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
    set_span_in_context,
    use_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion.trace_spans import SCOPE, CallSpan, StepSpan, step_record

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


_UNSET = Status(StatusCode.UNSET)  # immutable: shared by every step that did not fail


#: The batch processor's sizes unless ``OTEL_BSP_*`` set them, in calls (a queued item is a
#: call with its steps, seven spans for a tool call): twice the SDK's queue, so a burst while
#: the export thread waits on the collector is not dropped, and its 512 a request (about 3,500
#: spans: fewer, larger requests cost less).
_QUEUE_CALLS = 4_096
_BATCH_CALLS = 512


def _batch_sizes(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """``(max_queue_size, max_export_batch_size)`` for the batch processor: ``None`` where an
    ``OTEL_BSP_*`` variable decides (the SDK reads it, and warns about a bad one)."""
    queue = None if environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else _QUEUE_CALLS
    if environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
        return queue, None
    if queue is not None:
        return queue, _BATCH_CALLS
    try:  # never above the queue the variable sets (the SDK refuses a batch larger than it)
        return None, min(_BATCH_CALLS, int(environ["OTEL_BSP_MAX_QUEUE_SIZE"]))
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

    A governed request's span is a :class:`~bastion.trace_spans.CallSpan`: the provider's
    sampler, id generator and ``OTEL_ATTRIBUTE_*`` limits decide as for an SDK span, without the
    SDK span's locks and per-attribute checks. A step of the call (:meth:`child`) is cheaper
    still: its times are taken on the way in and out and it ends on its call, which goes to the
    batch processor as one item when it ends (``whole_calls``: the exporter is Bastion's own,
    ``otlp_export``, which encodes a call with its steps), else as the SDK's spans, one by one.
    Only a step that is ``current=True`` (its context goes upstream) is made the current context
    while it runs."""

    def __init__(
        self, provider: TracerProvider, processor: SpanProcessor, *, whole_calls: bool = False
    ) -> None:
        self._provider = provider
        self._processor = processor  # the one processor of this provider (batched export)
        self._whole_calls = whole_calls
        self._resource = provider.resource
        self._sampler = provider.sampler
        self._ids = provider.id_generator
        limits = SpanLimits()  # from OTEL_SPAN_ATTRIBUTE_* / OTEL_ATTRIBUTE_*, as the provider's own
        self._max_attributes = limits.max_span_attributes
        self._max_length = limits.max_span_attribute_length

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
        return cls(provider, processor, whole_calls=True)

    def shutdown(self) -> None:
        """Export what is still batched, then stop (blocking: run it in a worker thread)."""
        self._provider.shutdown()

    def call_span(self, name: str, meta: Any, attributes: dict[str, Any]) -> AbstractContextManager[Span]:
        """The span of one governed request, current while it runs, parented by the client's
        context (``_meta``, else the request's current context); the sampler decides, as the
        SDK's tracer asks it. An unsampled request's span records nothing (its context still
        goes upstream, unsampled)."""
        parent = _context_from_meta(meta)
        authenticated = _AUTHENTICATED.get()
        if authenticated is not None:
            _AUTHENTICATED.set(None)  # one call's: a later request in this context authenticates anew
        parent_context: SpanContext | None = get_current_span(parent).get_span_context()
        if parent_context is None or not parent_context.is_valid:
            parent_context = None
            trace_id = self._ids.generate_trace_id()
            random_id = self._ids.is_trace_id_random()
        else:
            trace_id = parent_context.trace_id
            random_id = parent_context.trace_flags.random_trace_id
        sampled = self._sampler.should_sample(parent, trace_id, name, SpanKind.SERVER, attributes)
        is_sampled = sampled.decision is Decision.RECORD_AND_SAMPLE
        flags = TraceFlags.SAMPLED if is_sampled else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        context = SpanContext(
            trace_id,
            self._ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=sampled.trace_state,
        )
        if not is_sampled:  # (a recorded span that is not sampled would never be exported)
            return use_span(NonRecordingSpan(context))
        span = CallSpan(
            name,
            context,
            parent_context,
            self._resource,
            dict(sampled.attributes or {}),
            time.time_ns() if authenticated is None else authenticated[0],  # the call began there
            max_attributes=self._max_attributes,
            max_length=self._max_length,
            on_end=self._ended,
        )
        if authenticated is not None:
            step_id = self._ids.generate_span_id()
            span.steps.append(
                step_record(("bastion.authentication", step_id, context.span_id, *authenticated, None, None))
            )
        return span  # current while its request runs, ended on the way out (CallSpan.__enter__)

    def child(self, name: str, *, current: bool = False) -> AbstractContextManager[Any]:
        """A child span of the current one (a step of the call), the current context while it
        runs only when ``current`` (a step whose context is passed on); nothing when the current
        span is not sampled."""
        span = get_current_span()
        if type(span) is CallSpan:  # (not isinstance: Span is an ABC, its check is slow)
            return _Step(self, name, span, span.context, current) if span.is_recording() else NO_SPAN
        if type(span) is StepSpan:
            return _Step(self, name, span.call, span.get_span_context(), current)
        parent = span.get_span_context()
        if not parent.trace_flags.sampled:
            return NO_SPAN
        return _Step(self, name, None, parent, current)  # under a span that is not Bastion's

    def _ended(self, span: CallSpan) -> None:
        if self._whole_calls:
            self._processor.on_end(span)  # type: ignore[arg-type]  # the exporter encodes calls
            return
        for readable in span.readable_spans():
            self._processor.on_end(readable)

    def _export(self, step: _Step, end_ns: int, error_type: str | None) -> None:
        """A step whose call has ended (or that is under another's span): on its own."""
        status = _UNSET if error_type is None else Status(StatusCode.ERROR, error_type)
        parent = step.parent
        self._processor.on_end(
            ReadableSpan(
                step.name,
                context=SpanContext(
                    parent.trace_id, step.span_id, False, parent.trace_flags, parent.trace_state
                ),
                parent=parent,
                resource=self._resource,
                attributes=step.attributes,
                kind=SpanKind.INTERNAL,
                status=status,
                start_time=step.start_ns,
                end_time=end_ns,
                instrumentation_scope=SCOPE,
            )
        )


class _Step:
    """One step of a call: a child span, ended on its call (:meth:`Tracing.child`)."""

    __slots__ = (
        "_current",
        "_token",
        "_tracing",
        "attributes",
        "call",
        "name",
        "parent",
        "span_id",
        "start_ns",
    )

    def __init__(
        self, tracing: Tracing, name: str, call: CallSpan | None, parent: SpanContext, current: bool
    ) -> None:
        self._tracing, self.name, self.call, self.parent, self._current = tracing, name, call, parent, current
        self.span_id: int = tracing._ids.generate_span_id()
        self.attributes: dict[str, Any] | None = None
        self._token: object | None = None
        self.start_ns = 0

    def set_attribute(self, key: str, value: Any) -> None:
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value

    def __enter__(self) -> _Step:
        if self._current:
            parent = self.parent
            context = SpanContext(
                parent.trace_id, self.span_id, False, parent.trace_flags, parent.trace_state
            )
            current = NonRecordingSpan(context) if self.call is None else StepSpan(context, self.call)
            self._token = otel_context.attach(set_span_in_context(current))
        self.start_ns = time.time_ns()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        end_ns = time.time_ns()
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        error_type = None if exc is None else type(exc).__name__  # the type only: its text may carry a value
        call = self.call
        if call is not None and call.end_time is None:
            record = (
                self.name,
                self.span_id,
                self.parent.span_id,
                self.start_ns,
                end_ns,
                self.attributes,
                error_type,
            )
            call.steps.append(step_record(record))
        else:
            self._tracing._export(self, end_ns, error_type)


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
