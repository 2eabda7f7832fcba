"""The span of one governed request and its steps, as Bastion records them (issue #25: cost).

The SDK's span takes a lock and validates every attribute, and each span goes through the
processor on its own. A :class:`CallSpan` is the same data without that: it is the current
span while its request runs (an OpenTelemetry :class:`~opentelemetry.trace.Span`, so the
propagator, ``get_current_span`` and the semantic-convention setters work on it as on any
span), and its steps (:class:`StepRecord`, made by ``Tracing.child``) end on it. At its end
the call goes to the batch processor as one item; ``otlp_export`` encodes the call and its
steps together, and :meth:`CallSpan.readable_spans` gives them as the SDK's spans for any other
processor. The sampler and ``OTEL_ATTRIBUTE_*`` limits still decide (``tracing.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    set_span_in_context,
)
from opentelemetry.util import types

__all__ = ["SCOPE", "CallSpan", "StepRecord", "StepSpan", "spans_of", "step_record"]

SCOPE = InstrumentationScope("bastion")
_UNSET = Status(StatusCode.UNSET)  # immutable: shared by every span that did not fail


class StepRecord(NamedTuple):
    """A finished step of a call: a child span in the call's trace (kind internal)."""

    name: str
    span_id: int
    parent_span_id: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] | None
    error_type: str | None  # an exception's type name, never its text; None: status unset


#: A ``StepRecord`` from one tuple of its fields, in order: ``tuple.__new__`` without the named
#: tuple's own ``__new__`` (a Python function: a microsecond a step, six steps a call).
step_record: Callable[[tuple[Any, ...]], StepRecord] = partial(tuple.__new__, StepRecord)


class CallSpan(Span):
    """A governed request's span: recording, sampled, current while its request runs."""

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        resource: Resource,
        attributes: dict[str, Any],
        start_ns: int,
        *,
        max_attributes: int | None,
        max_length: int | None,
        on_end: Callable[[CallSpan], None] | None = None,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.resource = resource
        self.kind = SpanKind.SERVER
        self.attributes: dict[str, Any] = {}
        self.dropped_attributes = 0
        self.events: list[Event] = []
        self.status = _UNSET
        self.start_time = start_ns
        self.end_time: int | None = None
        self.steps: list[StepRecord] = []
        self._max_attributes = max_attributes
        self._max_length = max_length
        self._on_end = on_end  # called once, with this span, when it ends
        self._token: Any = None
        self.set_attributes(attributes)

    # -- the Span API
    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if self.end_time is not None:
            return
        room = self._max_attributes is None or len(self.attributes) + len(attributes) <= self._max_attributes
        if room and self._max_length is None:
            self.attributes.update(attributes)  # nothing to cut, nothing dropped: the usual case
            return
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        if self.end_time is not None:
            return
        if self._max_length is not None and isinstance(value, str):
            value = value[: self._max_length]  # as the SDK cuts at OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
        kept = self.attributes
        if self._max_attributes is not None and key not in kept and len(kept) >= self._max_attributes:
            if self._max_attributes == 0:
                self.dropped_attributes += 1
                return
            del kept[next(iter(kept))]  # the oldest goes, as in the SDK's bounded attributes
            self.dropped_attributes += 1
        kept[key] = value

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_time is not None or self.status.status_code is StatusCode.OK:
            return  # OK is final (the SDK's rule)
        if isinstance(status, Status):
            self.status = status
        else:
            self.status = Status(status, description if status is StatusCode.ERROR else None)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self.end_time is None:
            self.events.append(Event(name, attributes, timestamp or time.time_ns()))

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """The exception's type only: its message and traceback may carry a value."""
        self.add_event("exception", {"exception.type": type(exception).__name__}, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = time.time_ns() if end_time is None else end_time
        if self._on_end is not None:
            self._on_end(self)

    # -- current while its request runs (as the SDK's use_span, without a generator)
    def __enter__(self) -> CallSpan:
        self._token = otel_context.attach(set_span_in_context(self))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        # Its outcome sets its status (tracing.set_outcome): an exception is never recorded, its
        # text may quote an argument or be an upstream's words.
        otel_context.detach(self._token)
        self.end()

    # -- as the SDK's spans
    def readable_spans(self) -> list[ReadableSpan]:
        """This call and its steps as the SDK's finished spans (the call first)."""
        attributes: Any = self.attributes
        if self.dropped_attributes:
            attributes = BoundedAttributes(attributes=self.attributes, immutable=True)
            attributes.dropped = self.dropped_attributes
        call = ReadableSpan(
            self.name,
            context=self.context,
            parent=self.parent,
            resource=self.resource,
            attributes=attributes,
            events=tuple(self.events),
            kind=self.kind,
            status=self.status,
            start_time=self.start_time,
            end_time=self.end_time,
            instrumentation_scope=SCOPE,
        )
        return [call, *(self.readable_step(step) for step in self.steps)]

    def readable_step(self, step: StepRecord) -> ReadableSpan:
        context, trace = self.context, self.context.trace_id
        return ReadableSpan(
            step.name,
            context=SpanContext(trace, step.span_id, False, context.trace_flags, context.trace_state),
            parent=SpanContext(trace, step.parent_span_id, False, context.trace_flags, context.trace_state),
            resource=self.resource,
            attributes=step.attributes,
            kind=SpanKind.INTERNAL,
            status=_UNSET if step.error_type is None else Status(StatusCode.ERROR, step.error_type),
            start_time=step.start_ns,
            end_time=step.end_ns,
            instrumentation_scope=SCOPE,
        )


class StepSpan(NonRecordingSpan):
    """A step's context while it is current (its context is passed on): a step begun inside it
    is its child in the same call."""

    def __init__(self, context: SpanContext, call: CallSpan) -> None:
        super().__init__(context)
        self.call = call


def spans_of(items: Sequence[ReadableSpan | CallSpan]) -> list[ReadableSpan]:
    """The SDK's spans of a batch that holds calls (for an exporter that knows only those)."""
    out: list[ReadableSpan] = []
    for item in items:
        if isinstance(item, CallSpan):
            out.extend(item.readable_spans())
        else:
            out.append(item)
    return out
