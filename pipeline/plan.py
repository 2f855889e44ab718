"""The pipeline plan: which steps run, in what order, how they fan out. Both runners execute it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from kenning.pipeline import tasks
from kenning.pipeline.context import Job, PipelineConfig, Services
from kenning.pipeline.errors import BREAKER_OPEN
from kenning.pipeline.fencing import fenced_services
from kenning.pipeline.models import (
    DISTRIBUTED,
    RUNNING,
    ChunkStatus,
    Dataset,
    PipelineRun,
    RunStatus,
    Scope,
    utcnow,
)
from kenning.pipeline.spend import charged_to
from kenning.pipeline.tasks import Claim, Writing


class StepResult(BaseModel):
    """What a step reports: counters for the run, and the work items of a fan-out step."""

    counts: dict[str, int] = Field(default_factory=dict)
    items: list[str] = Field(default_factory=list)


StepFunction = Callable[[Services, Job, Sequence[str]], StepResult]
PartFunction = Callable[[Services, Job, Sequence[str], Writing, Claim | None], StepResult]


@dataclass(frozen=True)
class Step:
    name: str
    function: StepFunction
    fan_out: bool = False
    # Also run, pass after pass, over what the fan-out step before it has finished so far, while
    # it goes on: so writes overlap the LLM calls. Its final run after the fan-out does the rest.
    streams: bool = False
    # What a streamed step does once before its first pass, while the fan-out's first calls are out.
    prepare: Callable[[Services, Job], None] | None = None
    # A streamed step's work on what one batch of the fan-out before it finished: on the workers,
    # each batch is followed by its part, on any worker, while the other batches go on.
    part: PartFunction | None = None

    def batch_size(self, config: PipelineConfig) -> int:
        return config.extract_batch if self.fan_out else 1

    def run(self, services: Services, job: Job, items: Sequence[str]) -> StepResult:
        """The step's result; its counters include `ms_<name>`, the milliseconds it ran here. The step
        writes through `fenced_services`: none of its writes happens once the fence is lost."""
        return self._timed(lambda fenced: self.function(fenced, job, items), services, job)

    def run_part(
        self, services: Services, job: Job, items: Sequence[str], writing: Writing, claim: Claim | None = None
    ) -> StepResult:
        """The step's `part` over the fan-out's batch `items`, as `run` runs the step."""
        part = self.part
        if part is None:
            raise ValueError(f"step {self.name} has no part")
        return self._timed(lambda fenced: part(fenced, job, items, writing, claim), services, job)

    def _timed(self, work: Callable[[Services], StepResult], services: Services, job: Job) -> StepResult:
        started = time.perf_counter()
        with charged_to(job.run_id, job.dataset_id):  # every LLM request is recorded as the run's spend
            result = work(fenced_services(services))
        key = f"ms_{self.name}"
        result.counts[key] = result.counts.get(key, 0) + round((time.perf_counter() - started) * 1000)
        return result


def _classify(services: Services, job: Job, _items: Sequence[str]) -> StepResult:
    return StepResult(counts=tasks.classify(services, job))


def _chunk(services: Services, job: Job, _items: Sequence[str]) -> StepResult:
    pending = tasks.chunk(services, job)
    # The fan-out's items are extraction units: batches never split one.
    units = tasks.extraction_units(services, job, pending)
    return StepResult(counts={"chunks_to_extract": len(pending)}, items=units)


def _extract(services: Services, job: Job, items: Sequence[str]) -> StepResult:
    return StepResult(counts=tasks.extract(services, job, items))


def _load(services: Services, job: Job, _items: Sequence[str]) -> StepResult:
    return StepResult(counts=tasks.load(services, job))


def _load_part(
    services: Services, job: Job, items: Sequence[str], writing: Writing, claim: Claim | None
) -> StepResult:
    return StepResult(counts=tasks.load_part(services, job, items, writing, claim))


def _prepare_load(services: Services, _job: Job) -> None:
    tasks.ensure_collections(services)


def _fk_edges(services: Services, job: Job, _items: Sequence[str]) -> StepResult:
    run = services.metadata.get_run(job.run_id)
    structured = run.stats.get("structured", 0) if run else 0
    counts = tasks.fk_edges(services, job, structured)
    return StepResult(counts={f"fk_{name}": value for name, value in counts.items()})


PLAN: tuple[Step, ...] = (
    Step("classify", _classify),
    Step("chunk", _chunk),
    Step("extract", _extract, fan_out=True),
    Step("load", _load, streams=True, prepare=_prepare_load, part=_load_part),
    Step("fk_edges", _fk_edges),
)
STEPS = {step.name: step for step in PLAN}


def streamed_after(plan: Sequence[Step], index: int) -> Step | None:
    """The step after `plan[index]` (a fan-out) when it streams over the fan-out's work, else None."""
    following = plan[index + 1] if index + 1 < len(plan) else None
    return following if following is not None and following.streams else None


def start_run(services: Services, scope: Scope, run_id: str | None = None, *, mode: str = DISTRIBUTED) -> Job:
    """Create the dataset if needed and a new pipeline run for it (of `run_id`, when the caller
    had to name the run before it could start), recorded as run by `mode`'s runner."""
    dataset: Dataset = services.metadata.ensure_dataset(scope)
    # Random, not from the clock: two processes starting a run at the same microsecond got one id
    # between them, and the workers ran the one run twice.
    run_id = run_id or str(uuid.uuid4())
    run = PipelineRun(id=run_id, dataset_id=dataset.id, status=RunStatus.STARTED, mode=mode)
    services.metadata.save_run(run)
    return Job(run_id=run_id, dataset_id=dataset.id, tenant=scope.tenant, dataset=scope.dataset)


def interrupt_others(services: Services, job: Job, why: str) -> list[str]:
    """Mark the dataset's other started embedded runs interrupted: the caller holds the dataset's
    lock, which an embedded run holds from before its record is made, so none of them can still be
    running. Their ids. A distributed run is left to the supervisor: its tasks may be waiting for
    the lock."""
    dead = [
        run
        for run in services.metadata.list_runs(job.dataset_id)
        if run.id != job.run_id and run.status in RUNNING and run.embedded
    ]
    for run in dead:
        run.status, run.error, run.finished_at = RunStatus.INTERRUPTED, why, utcnow()
        services.metadata.save_run(run)
    return [run.id for run in dead]


def record_step(services: Services, job: Job, step: str, counts: dict[str, int]) -> PipelineRun:
    """Add a finished step's counters to its run. Steps of one run never record concurrently."""
    run = _run(services, job)
    for name, value in counts.items():
        run.stats[name] = run.stats.get(name, 0) + value
    run.step = step
    fenced_services(services).metadata.save_run(run)
    return run


def finish_run(services: Services, job: Job) -> PipelineRun:
    """End the run: completed, or completed with errors when some items or chunks failed. When
    the LLM's circuit breaker failed chunks, the error says so first, in one line."""
    run = _run(services, job)
    run.status, run.finished_at = RunStatus.COMPLETED, utcnow()
    failures = {name: run.stats.get(name, 0) for name in ("failed_items", "failed_chunks")}
    if any(failures.values()):
        run.status = RunStatus.COMPLETED_WITH_ERRORS
        counts = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in failures.items() if n)
        run.error = f"{counts}: `kenning status` lists each with its reason"
        if run.stats.get("unreachable_chunks"):
            run.error = f"{breaker_cause(services, job)}; {run.error}"
    fenced_services(services).metadata.save_run(run)
    return run


def breaker_cause(services: Services, job: Job) -> str:
    """Why the LLM's breaker opened, as a chunk it failed says (`LLMUnreachable`)."""
    chunks = services.chunks
    failed = chunks.get_chunks(chunks.list_chunk_ids(job.dataset_id, ChunkStatus.FAILED))
    return next((c.error for c in failed if c.error and BREAKER_OPEN in c.error), f"LLM {BREAKER_OPEN}")


def fail_run(services: Services, job: Job, error: str) -> PipelineRun:
    run = _run(services, job)
    run.status, run.error, run.finished_at = RunStatus.ERRORED, error[:2000], utcnow()
    services.metadata.save_run(run)
    return run


def _run(services: Services, job: Job) -> PipelineRun:
    run = services.metadata.get_run(job.run_id)
    if run is None:
        raise LookupError(f"pipeline run {job.run_id} does not exist")
    return run


def merge_counts(results: Sequence[StepResult]) -> dict[str, int]:
    total: dict[str, int] = {}
    for result in results:
        for name, value in result.counts.items():
            total[name] = total.get(name, 0) + value
    return total


def successor_of(runs: list[PipelineRun], run: PipelineRun) -> PipelineRun | None:
    """The run of the same dataset that took over from `run`: the first started after it."""
    later = [other for other in runs if other.id != run.id and other.started_at >= run.started_at]
    return min(later, key=lambda other: (other.started_at, other.id), default=None)
