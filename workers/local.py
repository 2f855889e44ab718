"""The embedded runner: the pipeline plan in one process, fan-out steps on a bounded thread pool."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from kenning.pipeline.context import Job, Services
from kenning.pipeline.locking import held, lock_name
from kenning.pipeline.models import PipelineRun, RunStatus, Scope, utcnow
from kenning.pipeline.plan import (
    PLAN,
    Step,
    StepResult,
    fail_run,
    finish_run,
    interrupt_others,
    merge_counts,
    record_step,
    start_run,
)
from kenning.pipeline.ports import Lock, MetadataStore, chunked
from kenning.pipeline.progress import reporting

EMBEDDED_PID = "embedded_pid"

# (step name, done, total): called as work advances, from the runner's thread.
ProgressCallback = Callable[[str, int, int], None]


def no_progress(_step: str, _done: int, _total: int) -> None:
    return None


def close_dead_runs(metadata: MetadataStore, dataset_id: str) -> list[str]:
    """Mark interrupted the dataset's started embedded runs whose process is gone; their ids.

    Only runs of this machine's embedded runner carry a pid; a run on Celery workers is left to them.
    """
    dead = []
    for run in metadata.list_runs(dataset_id):
        pid = run.stats.get(EMBEDDED_PID)
        if run.status == RunStatus.STARTED and pid and not _alive(pid):
            run.status, run.finished_at = RunStatus.INTERRUPTED, utcnow()
            run.error = f"its process ({pid}) ended before it finished; the next cognify resumes its work"
            metadata.save_run(run)
            dead.append(run.id)
    return dead


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


class LocalRunner:
    """Runs the pipeline plan for one dataset at a time, under the dataset lock."""

    def __init__(
        self,
        services: Services,
        lock: Lock,
        *,
        concurrency: int = 4,
        lock_ttl_s: float = 600.0,
        plan: Sequence[Step] = PLAN,
        progress: ProgressCallback = no_progress,
    ) -> None:
        self._services = services
        self._lock = lock
        self._concurrency = concurrency
        self._lock_ttl_s = lock_ttl_s
        self._plan = plan
        self._progress = progress

    def run(self, scope: Scope, run_id: str | None = None) -> PipelineRun:
        """Cognify the dataset; the returned run holds the counters of every step. `run_id`
        names the run (default: a new id), for a caller that gave it out before the run began."""
        with held(self._lock, lock_name(scope), self._lock_ttl_s):
            job = start_run(self._services, scope, run_id)
            # The process that runs it: `close_dead_runs` tells a run killed with it by this pid.
            record_step(self._services, job, "begin", {EMBEDDED_PID: os.getpid()})
            why = f"its process ended before it finished; run {job.run_id} resumed its work"
            interrupt_others(self._services, job, why)
            try:
                self._run_steps(job)
            except BaseException as error:
                fail_run(self._services, job, f"{type(error).__name__}: {error}")
                raise
            return finish_run(self._services, job)

    def _run_steps(self, job: Job) -> None:
        items: list[str] = []
        for step in self._plan:
            if step.fan_out:
                # Each batch is recorded as it ends, so a killed run keeps what it spent.
                self._fan_out(step, job, items)
                continue
            with reporting(self._progress) as reported:
                result = step.run(self._services, job, items)
            record_step(self._services, job, step.name, result.counts)
            if not reported.count:  # a step with no units of its own: one, done
                self._progress(step.name, 1, 1)
            items = result.items

    def _fan_out(self, step: Step, job: Job, items: list[str]) -> StepResult:
        batches = list(chunked(items, step.batch_size(self._services.config)))
        results: list[StepResult] = []
        self._progress(step.name, 0, len(items))
        with ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix=step.name) as pool:
            done = 0
            for batch, result in zip(
                batches, pool.map(lambda b: step.run(self._services, job, b), batches), strict=True
            ):
                results.append(result)
                record_step(self._services, job, step.name, result.counts)
                done += len(batch)
                self._progress(step.name, done, len(items))
        return StepResult(counts=merge_counts(results))
