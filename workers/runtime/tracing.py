"""OpenTelemetry tracing, off by default. With `KENNING_OTEL_ENDPOINT` set (an OTLP/HTTP traces
URL, e.g. http://127.0.0.1:4318/v1/traces; the `otel` extra), every search is a span, and every
cognify run a span with one child per step (from its first progress report to its last).

The spans go through a tracer provider of kenning's own, never the process's global one, so an
application's own tracing setup is left as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kenning.workers.runtime.extras import needs_extra

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

Attribute = str | int | float | bool


class Tracing:
    """Spans to one OTLP endpoint, batched in a background thread."""

    def __init__(self, endpoint: str) -> None:
        with needs_extra("tracing"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider: TracerProvider = TracerProvider(resource=Resource.create({"service.name": "kenning"}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer: Tracer = self.provider.get_tracer("kenning")

    @contextmanager
    def span(self, name: str, **attributes: Attribute) -> Iterator[None]:
        with self.tracer.start_as_current_span(name, attributes=attributes):
            yield

    def run(self, name: str, steps: Mapping[str, tuple[float, float]], **attributes: Attribute) -> None:
        """A span for a run that has ended, with a child per step: (start, end) epoch seconds."""
        from opentelemetry import trace

        if not steps:
            return
        start = min(first for first, _ in steps.values())
        end = max(last for _, last in steps.values())
        parent = self.tracer.start_span(name, attributes=attributes, start_time=_ns(start))
        context = trace.set_span_in_context(parent)
        for step, (first, last) in steps.items():
            child = self.tracer.start_span(f"kenning.step.{step}", context=context, start_time=_ns(first))
            child.end(end_time=_ns(last))
        parent.end(end_time=_ns(end))

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Send the spans still batched; False when the endpoint did not take them in time."""
        return self.provider.force_flush(int(timeout_s * 1000))


@functools.cache
def tracing(endpoint: str) -> Tracing | None:
    """The tracing to `endpoint` (made once per endpoint); None when it is empty: tracing is off."""
    return Tracing(endpoint) if endpoint else None


@contextmanager
def traced(endpoint: str, name: str, **attributes: Attribute) -> Iterator[None]:
    """The block as a span, when tracing to `endpoint` is on."""
    found = tracing(endpoint)
    if found is None:
        yield
        return
    with found.span(name, **attributes):
        yield


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)
