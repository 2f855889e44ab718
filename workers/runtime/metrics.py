"""Prometheus metrics of one process: runs and their steps, run counters (chunks, items, ...),
Celery tasks, search latency per type, HTTP latency per route, LLM calls, tokens and retries by
purpose (`extraction`: the extractor's; `completion`: the completer's, every search's).

`metrics()` is this process's set, made on first use; without `prometheus_client` (the `api` and
`server` extras install it) it is `NoMetrics`, which records nothing, so the embedded install
runs unchanged. The API exposes the set at `GET /metrics`; a Celery worker on the port of
`KENNING_METRICS_PORT` (0: none).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from kenning.pipeline.errors import KenningError
from kenning.pipeline.models import PipelineRun
from kenning.pipeline.progress import ProgressCallback
from kenning.workers.runtime.tracing import tracing

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: from a lexical lookup (sub-millisecond) to a completion or a whole run step.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
STEP_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


class LLMCounters(Protocol):
    """What an LLM client counts (`kenning.storage.inference.llm_openai.LLMUsage`)."""

    @property
    def calls(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def retries(self) -> int: ...
    @property
    def rate_limited(self) -> int: ...


LLMRead = Callable[[], "tuple[Mapping[str, LLMCounters], str] | None"]


class LLMPorts(Protocol):
    """What `wiring_llm` reads of a `Wiring`: its settings' endpoint and its two LLM clients."""

    @property
    def extractor(self) -> object: ...
    @property
    def completer(self) -> object: ...


def wiring_llm(wiring: LLMPorts, llm_url: str) -> tuple[dict[str, LLMCounters], str] | None:
    """The counters of the wiring's LLM clients by purpose, and its breaker's state; None without an
    LLM endpoint (or with clients that count nothing, as test doubles)."""
    if not llm_url:
        return None
    extractor = wiring.extractor
    state = getattr(extractor, "breaker_state", None)
    if not isinstance(state, str):
        return None
    clients = {"extraction": extractor, "completion": wiring.completer}
    counted = {purpose: getattr(client, "usage", None) for purpose, client in clients.items()}
    return {purpose: usage for purpose, usage in counted.items() if usage is not None}, state


class NoMetrics:
    """Records nothing: the set without `prometheus_client`."""

    def searched(self, search_type: str, seconds: float) -> None:
        """A search of that type took `seconds`."""

    def ran(self, run: PipelineRun, steps: Mapping[str, float]) -> None:
        """A run ended, with each step's seconds (first report to last)."""

    def requested(self, method: str, route: str, status: int, seconds: float) -> None:
        """An HTTP request to a route (its template, not its path) answered."""

    def task_ran(self, task: str, outcome: str, seconds: float) -> None:
        """A Celery task ended (`succeeded`, `failed` or `retried`)."""

    def watch_llm(self, read: LLMRead) -> None:
        """Report the LLM counters (by purpose) and breaker state that `read` gives, at each scrape
        (instead of those of an earlier `read`)."""

    def watch_queues(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Report the queue depths that `read` gives, at each scrape (none while it fails;
        instead of those of an earlier `read`)."""

    def exposition(self) -> bytes:
        """The text format for a scrape."""
        return b""

    def serve(self, port: int) -> None:
        """Answer scrapes on the port (all interfaces), in a daemon thread; OSError when taken."""


class Metrics(NoMetrics):
    """The metrics, in a registry of their own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

        self.registry = CollectorRegistry()
        self._llm: LLMCollector | None = None
        self._queues: QueueCollector | None = None
        self._mutex = threading.Lock()
        ProcessCollector(registry=self.registry)
        registry = self.registry
        self.search_seconds = Histogram(
            "kenning_search_seconds", "Search latency", ["type"], buckets=LATENCY_BUCKETS, registry=registry
        )
        self.runs = Counter("kenning_runs", "Pipeline runs ended, by status", ["status"], registry=registry)
        self.step_seconds = Histogram(
            "kenning_step_seconds", "Run step durations", ["step"], buckets=STEP_BUCKETS, registry=registry
        )
        self.run_counts = Counter(
            "kenning_run_counts",
            "Counters of ended runs (chunks, items, ...)",
            ["counter"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "kenning_http_request_seconds",
            "HTTP request latency",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.task_seconds = Histogram(
            "kenning_task_seconds",
            "Celery task durations",
            ["task", "outcome"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )

    def searched(self, search_type: str, seconds: float) -> None:
        self.search_seconds.labels(search_type).observe(seconds)

    def ran(self, run: PipelineRun, steps: Mapping[str, float]) -> None:
        self.runs.labels(run.status.value).inc()
        for step, seconds in steps.items():
            self.step_seconds.labels(step).observe(seconds)
        for name, value in run.stats.items():
            # Timings are the step histogram's; a pid is no count.
            if value > 0 and not name.startswith("ms_") and not name.endswith("_pid"):
                self.run_counts.labels(name).inc(value)

    def requested(self, method: str, route: str, status: int, seconds: float) -> None:
        self.request_seconds.labels(method, route, str(status)).observe(seconds)

    def task_ran(self, task: str, outcome: str, seconds: float) -> None:
        self.task_seconds.labels(task, outcome).observe(seconds)

    def watch_llm(self, read: LLMRead) -> None:
        # One LLM client per process: a later app's replaces an earlier one's.
        with self._mutex:
            if self._llm is not None:
                self.registry.unregister(self._llm)
            self._llm = LLMCollector(read)
            self.registry.register(self._llm)

    def watch_queues(self, read: Callable[[], Mapping[str, int]]) -> None:
        # One broker per process: a later reader replaces an earlier one.
        with self._mutex:
            if self._queues is not None:
                self.registry.unregister(self._queues)
            self._queues = QueueCollector(read)
            self.registry.register(self._queues)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(self, port: int) -> None:
        from prometheus_client import start_http_server

        start_http_server(port, registry=self.registry)


class LLMCollector:
    """The LLM clients' own counters, by purpose, read at scrape time (they are cumulative already)."""

    def __init__(self, read: LLMRead) -> None:
        self.read = read

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked: `read` may open a client, which a registration must not do

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        found = self.read()
        if found is None:
            return
        usages, breaker = found
        families = {
            "calls": CounterMetricFamily("kenning_llm_calls", "LLM requests sent", labels=["purpose"]),
            "retries": CounterMetricFamily("kenning_llm_retries", "LLM requests retried", labels=["purpose"]),
            "rate_limited": CounterMetricFamily(
                "kenning_llm_rate_limited", "LLM requests refused (429)", labels=["purpose"]
            ),
        }
        tokens = CounterMetricFamily("kenning_llm_tokens", "LLM tokens billed", labels=["purpose", "kind"])
        for purpose, usage in sorted(usages.items()):
            families["calls"].add_metric([purpose], usage.calls)
            families["retries"].add_metric([purpose], usage.retries)
            families["rate_limited"].add_metric([purpose], usage.rate_limited)
            tokens.add_metric([purpose, "prompt"], usage.prompt_tokens)
            tokens.add_metric([purpose, "completion"], usage.completion_tokens)
        yield from families.values()
        yield tokens
        state = GaugeMetricFamily(
            "kenning_llm_breaker", "LLM circuit breaker: 1 in its state", labels=["state"]
        )
        for name in ("closed", "open", "half-open"):
            state.add_metric([name], 1.0 if breaker == name else 0.0)
        yield state


class QueueCollector:
    """Tasks waiting per queue, read at scrape time; nothing while the broker does not answer."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self.read = read

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked: a registration must not reach the broker

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import GaugeMetricFamily

        try:
            depths = self.read()
        except KenningError:
            return
        gauge = GaugeMetricFamily("kenning_queue_depth", "Tasks waiting in a queue", labels=["queue"])
        for queue, depth in sorted(depths.items()):
            gauge.add_metric([queue], depth)
        yield gauge


@functools.cache
def metrics() -> NoMetrics:
    """This process's metrics (made once): `Metrics`, or `NoMetrics` without prometheus_client."""
    try:
        return Metrics()
    except ModuleNotFoundError:
        return NoMetrics()


@contextmanager
def timed_search(search_type: str) -> Iterator[None]:
    """Record the block's seconds as a search of that type."""
    started = time.perf_counter()
    try:
        yield
    finally:
        metrics().searched(search_type, time.perf_counter() - started)


class StepClock:
    """A progress callback that times each step, from its first report to its last, and passes
    every report on. Steps overlap (loading streams behind extraction), so each has its own span.
    With an OpenTelemetry endpoint, the run and its steps become spans too."""

    def __init__(self, progress: ProgressCallback, otel_endpoint: str = "") -> None:
        self.progress = progress
        self.otel_endpoint = otel_endpoint
        self.spans: dict[str, tuple[float, float]] = {}
        self._mutex = threading.Lock()

    def __call__(self, step: str, done: int, total: int) -> None:
        now = time.time()  # epoch seconds: span times
        with self._mutex:
            first, _ = self.spans.get(step, (now, now))
            self.spans[step] = (first, now)
        self.progress(step, done, total)

    def ended(self, run: PipelineRun) -> PipelineRun:
        """Record the run and its steps; the run, unchanged."""
        with self._mutex:
            spans = dict(self.spans)
        metrics().ran(run, {step: last - first for step, (first, last) in spans.items()})
        traces = tracing(self.otel_endpoint)
        if traces is not None:
            traces.run("kenning.cognify", spans, run_id=run.id, status=run.status.value)
        return run


def instrument_celery() -> None:
    """Time every task of this worker process, by task name and outcome (Celery's signals)."""
    from celery.signals import task_failure, task_postrun, task_prerun, task_retry

    started: dict[str, float] = {}
    failed: set[str] = set()

    def before(task_id: str = "", **_: Any) -> None:
        started[task_id] = time.perf_counter()

    def failure(task_id: str = "", **_: Any) -> None:
        failed.add(task_id)

    def retry(request: Any = None, **_: Any) -> None:
        failed.add(f"retry:{getattr(request, 'id', '')}")

    def after(task_id: str = "", task: Any = None, **_: Any) -> None:
        began = started.pop(task_id, None)
        if began is None:
            return
        outcome = "succeeded"
        if f"retry:{task_id}" in failed:
            outcome = "retried"
        elif task_id in failed:
            outcome = "failed"
        failed.discard(task_id)
        failed.discard(f"retry:{task_id}")
        metrics().task_ran(getattr(task, "name", "unknown"), outcome, time.perf_counter() - began)

    # weak=False: these closures have no other reference.
    task_prerun.connect(before, weak=False)
    task_failure.connect(failure, weak=False)
    task_retry.connect(retry, weak=False)
    task_postrun.connect(after, weak=False)


def serve_worker_metrics(port: int, tries: int = 64) -> int | None:
    """Instrument this Celery worker process and answer scrapes on the first free port from
    `port` on (pool processes of one worker take one each); None when none of them is free."""
    for candidate in range(port, min(port + tries, 65536)):
        try:
            metrics().serve(candidate)
        except OSError:
            continue
        instrument_celery()
        return candidate
    return None
