"""Cognify on the Celery workers: the run's chain, built from the pipeline plan, and a progress view."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, chain
from celery.exceptions import TimeoutError as CeleryTimeout
from kombu.exceptions import OperationalError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kenning.pipeline.context import Job, Services
from kenning.pipeline.errors import NoWorker, TransientStoreError
from kenning.pipeline.models import ENDED, ChunkStatus, PipelineRun, RunStatus, Scope
from kenning.pipeline.plan import PLAN, fail_run, start_run, successor_of
from kenning.pipeline.redact import redact_url
from kenning.pipeline.spend import Spend
from kenning.retrieval.contract import SearchResult
from kenning.workers.celery.app import app, configure_app
from kenning.workers.runtime import keys
from kenning.workers.runtime.settings import Settings
from kenning.workers.runtime.wiring import Wiring

POLL_S = 0.5
# How many runs in a row (each resuming the one before, interrupted) `follow` goes on to.
MAX_RESUMES_FOLLOWED = 10
# How long the workers have to say which queues they consume; a busy worker still answers
# at once, since its main thread (not its pool) replies.
PING_TIMEOUT_S = 2.0
# Broker URL -> the app that asks its workers what they consume (see `ping_app`).
_PING_APPS: dict[str, Celery] = {}
_PING_APPS_MUTEX = threading.Lock()


def run_chain(job: Job) -> Any:
    """The run as one Celery chain: begin, one task per plan step (fan-out steps as a chord), finish.

    Every task gets `kenning.fail` as its error callback.
    """
    ids = job.model_dump(mode="json")
    tasks = [app.signature("kenning.begin", args=(ids,))]
    for step in PLAN:
        if step.fan_out:
            tasks.append(app.signature("kenning.fan_out", kwargs={"step": step.name}))
        else:
            tasks.append(app.signature(f"kenning.{step.name}"))
    tasks.append(app.signature("kenning.finish"))
    return chain(*tasks).on_error(app.signature("kenning.fail", args=(ids,)))


def require_workers(settings: Settings, kinds: Sequence[str]) -> None:
    """Raise `NoWorker` unless, for each queue of `kinds`, some worker says it consumes it.

    The workers are asked over the broker and have `PING_TIMEOUT_S` to answer. The process-wide
    app is configured from `settings`: the caller is about to send it tasks.
    """
    configure_app(app, settings)
    ask_workers(app, settings, kinds)


def ping_app(broker_url: str) -> Celery:
    """A Celery app of its own that only asks the workers on `broker_url` what they consume.

    Looking at the workers (as listing runs does) must not configure the process-wide app:
    a process that lists runs of one deployment may send tasks with settings of another.
    """
    with _PING_APPS_MUTEX:
        if broker_url not in _PING_APPS:
            _PING_APPS[broker_url] = Celery("kenning-ping", broker=broker_url, set_as_current=False)
        return _PING_APPS[broker_url]


def ask_workers(celery: Celery, settings: Settings, kinds: Sequence[str]) -> None:
    """Raise `NoWorker` unless a worker reached through `celery` consumes each queue of `kinds`."""
    try:
        replies = celery.control.inspect(timeout=PING_TIMEOUT_S).active_queues() or {}
    except OperationalError as exc:
        raise TransientStoreError(
            redact_url(f"the broker at {settings.broker_url} did not answer: {exc}")
        ) from exc
    consumed = {queue["name"] for queues in replies.values() for queue in queues or ()}
    missing = [kind for kind in kinds if keys.queue_name(settings.queue_prefix, kind) not in consumed]
    if missing:
        names = ", ".join(keys.queue_name(settings.queue_prefix, kind) for kind in missing)
        raise NoWorker(
            f"no worker consumes {names} (none answered within {PING_TIMEOUT_S:.0f} s); "
            f"start one with `kenning worker --queues {','.join(missing)}`"
        )


def enqueue(services: Services, settings: Settings, scope: Scope) -> Job:
    """Create a run of the dataset and send its chain to the workers; the run waits there for the lock."""
    configure_app(app, settings)
    job = start_run(services, scope)
    try:
        run_chain(job).apply_async()
    except OperationalError as exc:
        fail_run(services, job, f"the broker did not take the run: {exc}")
        raise TransientStoreError(
            redact_url(f"the broker at {settings.broker_url} did not take the run: {exc}")
        ) from exc
    return job


def enqueue_cognify(settings: Settings, scope: Scope) -> str:
    """Enqueue a cognify run of the dataset on the workers; its id, to follow in the metadata store."""
    wiring = Wiring(settings)
    try:
        return enqueue(wiring, settings, scope).run_id
    finally:
        wiring.close()


def cognify_distributed(
    wiring: Wiring, scope: Scope, console: Console, *, timeout_s: float | None = None
) -> PipelineRun:
    """Cognify the dataset (which must exist) on the workers, drawing its progress on `console`,
    until the run completes or errors.

    A run that fails ends errored with the error's text. After `timeout_s` the run as it
    stands (still started) is returned; the workers go on with it. With no worker consuming a
    queue the run needs, `NoWorker` is raised and no run is made.
    """
    settings = wiring.settings
    require_workers(settings, ("pipeline", "extract", "load"))
    job = enqueue(wiring, settings, scope)
    console.print(f"run {job.run_id[:8]} of dataset {job.dataset!r} sent to the workers")
    timeout_s = timeout_s or settings.cognify_timeout_s
    return follow(wiring, job, console, timeout_s, ride_out_s=settings.store_retry_s)


def follow(
    services: Services, job: Job, console: Console, timeout_s: float, *, ride_out_s: float = 60.0
) -> PipelineRun:
    """Poll the run and its chunks until the run is finished, or `timeout_s` has passed.

    A run that the supervisor interrupted (its workers or messages were lost) is resumed by a
    new run: that one is followed in its stead, and so on (`MAX_RESUMES_FOLLOWED` at most). A
    metadata store that is away is waited for, up to `ride_out_s` at a time.
    """
    deadline = time.monotonic() + timeout_s
    run: PipelineRun | None = None
    for _ in range(MAX_RESUMES_FOLLOWED):
        left = max(0.0, deadline - time.monotonic())
        runs = watch(services, _only(job), console, left, POLL_S, labelled=False, ride_out_s=ride_out_s)
        run = runs[job.run_id]
        successor = _successor(services, run) if run.status == RunStatus.INTERRUPTED else None
        if successor is None:
            break
        console.print(f"run {run.id[:8]} was {run.error}; following run {successor.id[:8]}")
        job = job.model_copy(update={"run_id": successor.id})
    assert run is not None
    if run.status not in ENDED:
        console.print(
            f"run {job.run_id[:8]} is still {run.status.value} after {timeout_s:.0f} s; "
            "the workers go on with it (`kenning status` follows it)"
        )
    return run


def _only(job: Job) -> Callable[[], list[Job]]:
    return lambda: [job]


def _successor(services: Services, run: PipelineRun) -> PipelineRun | None:
    return successor_of(services.metadata.list_runs(run.dataset_id), run)


def watch(
    services: Services,
    find: Callable[[], list[Job]],
    console: Console,
    timeout_s: float,
    poll_s: float,
    *,
    labelled: bool = True,
    ride_out_s: float = 0.0,
    stalled: Callable[[list[tuple[Job, PipelineRun]]], dict[str, str]] | None = None,
) -> dict[str, PipelineRun]:
    """Draw the runs `find` names (asked again at each poll) until every one of them is finished.

    Each run has three bars: its steps, its chunks extracted (or already loaded) and its chunks
    written to the stores, each out of all its chunks, `labelled` with the run's dataset and id.
    Returns the runs seen, by id, as they last stood: after `timeout_s`, finished or not. A
    metadata store that is away is polled again until it has been away `ride_out_s` in a row.
    `stalled` names, by run id, the runs nothing works on and why: they are drawn as stalled.
    """
    deadline = time.monotonic() + timeout_s
    columns = (TextColumn("{task.description:>24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    jobs: dict[str, Job] = {}
    bars_of: dict[str, Bars] = {}
    runs: dict[str, PipelineRun] = {}
    away_since: float | None = None
    with Progress(*columns, console=console, transient=False) as bars:
        while True:
            try:
                jobs.update((job.run_id, job) for job in find())
                for run_id, job in jobs.items():
                    if run_id not in bars_of:
                        bars_of[run_id] = add_bars(bars, job, labelled)
                    runs[run_id] = current_run(services, job)
                why = stalled([(job, runs[run_id]) for run_id, job in jobs.items()]) if stalled else {}
                for run_id, job in jobs.items():
                    counts = chunk_counts(services, job)
                    spent = spend_of(services, job)
                    draw(bars, bars_of[run_id], runs[run_id], counts, why.get(run_id, ""), spent)
                away_since = None
            except TransientStoreError as error:
                now = time.monotonic()
                if away_since is None:
                    away_since = now
                    console.print(f"waiting up to {ride_out_s:.0f} s for the store: {error}")
                if now - away_since >= ride_out_s:
                    raise
                time.sleep(poll_s)
                continue
            if all(run.status in ENDED for run in runs.values()) or time.monotonic() >= deadline:
                return runs
            time.sleep(poll_s)


@dataclass(frozen=True)
class Bars:
    """The bars of one run, and the label in front of their descriptions."""

    steps: TaskID
    chunks: TaskID
    loaded: TaskID
    label: str = ""
    llm: TaskID | None = None


def add_bars(bars: Progress, job: Job, labelled: bool) -> Bars:
    label = f"{job.dataset} {job.run_id[:8]} " if labelled else ""
    steps = bars.add_task(f"{label}starting", total=len(PLAN))
    chunks = bars.add_task(f"{label}chunks extracted", total=None)
    loaded = bars.add_task(f"{label}chunks loaded", total=None)
    llm = bars.add_task(f"{label}{Spend().label}", total=None)
    return Bars(steps, chunks, loaded, label, llm)


def current_run(services: Services, job: Job) -> PipelineRun:
    run = services.metadata.get_run(job.run_id)
    if run is None:
        raise LookupError(f"pipeline run {job.run_id} does not exist")
    return run


def chunk_counts(services: Services, job: Job) -> dict[ChunkStatus, int]:
    return {status: len(services.chunks.list_chunk_ids(job.dataset_id, status)) for status in ChunkStatus}


def draw(
    bars: Progress,
    run_bars: Bars,
    run: PipelineRun,
    counts: dict[ChunkStatus, int],
    stalled: str = "",
    spent: Spend | None = None,
) -> None:
    """Move a run's bars; a run not ended that nothing works on (`stalled` says why) is drawn so.
    `spent`: the run's LLM requests so far (the spend ledger's), those that failed named."""
    names = [step.name for step in PLAN]
    done = names.index(run.step) + 1 if run.step in names else 0
    upcoming = names[done] if done < len(names) else "finish"
    label = run.status.value if run.status in ENDED else (upcoming if run.step else "starting")
    if stalled and run.status not in ENDED:
        label = f"stalled: {stalled}"
    bars.update(run_bars.steps, completed=done, description=run_bars.label + label)
    total = sum(counts.values())
    extracted = counts[ChunkStatus.EXTRACTED] + counts[ChunkStatus.LOADED]
    bars.update(run_bars.chunks, completed=extracted, total=total or None)
    # The load task marks each batch's chunks loaded once written: this bar moves during it.
    bars.update(run_bars.loaded, completed=counts[ChunkStatus.LOADED], total=total or None)
    if spent is not None and run_bars.llm is not None:
        label = run_bars.label + spent.label
        bars.update(run_bars.llm, completed=spent.answered, total=spent.calls or None, description=label)


def spend_of(services: Services, job: Job) -> Spend | None:
    """The run's LLM requests so far, from the spend ledger of a `Wiring` (None for other services)."""
    if not isinstance(services, Wiring):
        return None
    return services.spend.totals([job.run_id]).get(job.run_id, Spend())


def search_remote(
    settings: Settings, query: str, search_type: str, datasets: list[str], top_k: int, only_context: bool
) -> SearchResult:
    """Run a search on a query worker (`kenning.search`) and wait for its result."""
    require_workers(settings, ("query",))
    request = {
        "query": query,
        "type": search_type,
        "datasets": datasets,
        "tenant": settings.tenant,
        "top_k": top_k,
        "only_context": only_context,
    }
    try:
        reply = app.send_task("kenning.search", args=[request]).get(timeout=settings.query_timeout_s)
    except CeleryTimeout as error:
        raise TransientStoreError(
            f"no query worker answered within {settings.query_timeout_s:.0f} s "
            f"(is a worker consuming {settings.queue_prefix}.query?)"
        ) from error
    return SearchResult.model_validate(reply)
