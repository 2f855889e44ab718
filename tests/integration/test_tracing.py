"""OpenTelemetry tracing: off without an endpoint; with one, searches and cognify runs (a child
span per step) reach an OTLP/HTTP receiver."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.tracing import tracing

trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")


@contextmanager
def receiver() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 that keeps every request body."""
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies
    finally:
        server.shutdown()
        server.server_close()


def span_names(bodies: list[bytes]) -> list[str]:
    names = []
    for body in bodies:
        request = trace_service.ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                names.extend(span.name for span in scope.spans)
    return names


def test_tracing_is_off_without_an_endpoint() -> None:
    assert tracing("") is None


def test_searches_and_runs_reach_the_endpoint(tmp_path: Path) -> None:
    with receiver() as (endpoint, bodies):
        # Given a memory that traces to the receiver
        settings = load_settings(home=tmp_path / "home", embedding_provider="hash", otel_endpoint=endpoint)
        with Kenning(settings) as memory:
            # When it remembers (a cognify run) and searches
            memory.remember("Ada Lovelace wrote the first program.", "notes")
            memory.search("first program", "CHUNKS", datasets=["notes"], only_context=True)
        found = tracing(endpoint)
        assert found is not None and found.flush()
    # Then the receiver got the search, the run, and a span per step of the run
    names = span_names(bodies)
    assert "kenning.search" in names and "kenning.cognify" in names
    assert {"kenning.step.chunk", "kenning.step.extract", "kenning.step.load"} <= set(names)
