"""The embedded runner: the pipeline plan in one process, fan-out steps on a bounded thread pool."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from typing import Any

from kenning.pipeline.context import Job, Services
from kenning.pipeline.errors import StoreError
from kenning.pipeline.locking import held, lock_name
from kenning.pipeline.models import EMBEDDED, PipelineRun, RunStatus, Scope, utcnow
from kenning.pipeline.pacing import Metered, Pacer, window_of
from kenning.pipeline.plan import (
    PLAN,
    Step,
    StepResult,
    fail_run,
    finish_run,
    interrupt_others,
    record_step,
    start_run,
    streamed_after,
)
from kenning.pipeline.ports import Lock, MetadataStore, chunked
from kenning.pipeline.progress import reporting

# The process that runs an embedded run, a counter of its record: `close_dead_runs` tells a run
# whose process died by it. Whether a run is embedded is its `mode`, written before this.
EMBEDDED_PID = "embedded_pid"
# A fan-out step's batches are cut small enough that each thread of the pool gets this many:
# the calls in flight then stay even to the end instead of trailing off with a few long batches.
BATCHES_PER_THREAD = 4
# Batches this much later than they take on average are waiting out something: the fan-out's end
# cannot be told from them, and a load pass may start.
LATE_S = 1.0
# A streamed step falls behind its fan-out when this many load batches' worth of items wait
# for a pass: the fan-out then keeps one batch in flight, and none at twice that, until the
# writer catches up; so what is left to write when the fan-out ends (and the memory it holds
# meanwhile) stays bounded. Fewer makes passes smaller, and each pass costs more than its items.
BEHIND_BATCHES = 4

# (step name, done, total): called as work advances, from the runner's thread.
ProgressCallback = Callable[[str, int, int], None]


def no_progress(_step: str, _done: int, _total: int) -> None:
    return None


def as_is(run: PipelineRun) -> PipelineRun:
    return run


class _Cancelled(Exception):
    """The run's record says it was cancelled: the runner stops between batches."""


class Interrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C) stopped a run, which is recorded as interrupted; its message says which."""


class _Pool(ThreadPoolExecutor):
    """A thread pool that an interrupt leaves at once: no batch it holds starts, and those in flight
    are abandoned (each thread ends when its call does) instead of waited for."""

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: Any
    ) -> bool | None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            self.shutdown(wait=False, cancel_futures=True)
            return None
        return super().__exit__(kind, error, trace)


def close_dead_runs(metadata: MetadataStore, dataset_id: str) -> list[str]:
    """Mark interrupted the dataset's started embedded runs whose process is gone; their ids. A
    cancelled one that its process did not live to finish is finished now.

    Only runs of this machine's embedded runner carry a pid; a run on Celery workers is left to them.
    """
    dead = []
    for run in metadata.list_runs(dataset_id):
        pid = run.stats.get(EMBEDDED_PID)
        if not run.embedded or not pid or run.finished_at is not None or _alive(pid):
            continue
        if run.status == RunStatus.STARTED:
            run.status = RunStatus.INTERRUPTED
            run.error = f"its process ({pid}) ended before it finished; the next cognify resumes its work"
            dead.append(run.id)
        if run.status in (RunStatus.INTERRUPTED, RunStatus.CANCELLED):
            run.finished_at = utcnow()
            metadata.save_run(run)
    return dead


def in_its_process(run: PipelineRun) -> bool:
    """Whether the run is an embedded run whose process (on this machine) is alive."""
    pid = run.stats.get(EMBEDDED_PID)
    return bool(run.embedded and pid and _alive(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


class LocalRunner:
    """Runs the pipeline plan for one dataset at a time, under the dataset lock.

    A fan-out step keeps at most `concurrency` batches in flight; with `rpm` (the LLM's
    requests a minute, 0: no limit), as many as keep that limit busy at the latency its
    calls are observed to take (`pacing`), within `concurrency`; and never more than the
    extractor's server is seen to take at once (its `Window`), when it keeps one. A step that `streams`
    runs pass after pass, on one writer thread, over what the fan-out before it has
    finished (whenever the writer is free and a quarter of `load_batch` more items are
    ready), and once more after it: the writes overlap the LLM calls.

    A run whose record is marked cancelled (`kenning.workers.control.runs.cancel_run`) stops: the
    runner reads its record before each step and as fan-out batches finish, sends no more
    batches, records those in flight, and returns the run, `cancelled`. What it finished stays
    done (chunk by chunk): the next run of the dataset does the rest. `ended` gets the run
    the runner returns (the run metrics of a `StepClock`).
    """

    def __init__(
        self,
        services: Services,
        lock: Lock,
        *,
        concurrency: int = 32,
        rpm: int = 0,
        lock_ttl_s: float = 600.0,
        plan: Sequence[Step] = PLAN,
        progress: ProgressCallback = no_progress,
        ended: Callable[[PipelineRun], PipelineRun] = as_is,
    ) -> None:
        self._services = services
        self._lock = lock
        self._concurrency = concurrency
        self._rpm = rpm
        self._lock_ttl_s = lock_ttl_s
        self._plan = plan
        self._progress = progress
        self._ended = ended
        # A streamed step's passes and its last run report as one count (see `_Passes`).
        self._passes: dict[str, _Passes] = {}

    def run(self, scope: Scope, run_id: str | None = None) -> PipelineRun:
        """Cognify the dataset; the returned run holds the counters of every step. `run_id`
        names the run (default: a new id), for a caller that gave it out before the run began."""
        with held(self._lock, lock_name(scope), self._lock_ttl_s):
            job = start_run(self._services, scope, run_id, mode=EMBEDDED)
            # The process that runs it: `close_dead_runs` tells a run killed with it by this pid.
            record_step(self._services, job, "begin", {EMBEDDED_PID: os.getpid()})
            why = f"its process ended before it finished; run {job.run_id} resumed its work"
            interrupt_others(self._services, job, why)
            try:
                self._run_steps(job)
            except _Cancelled:
                return self._ended(self._stopped(job))
            except KeyboardInterrupt as error:
                raise Interrupted(self._interrupted(job)) from error
            except BaseException as error:
                fail_run(self._services, job, f"{type(error).__name__}: {error}")
                raise
            return self._ended(finish_run(self._services, job))

    def _cancelled(self, job: Job) -> bool:
        run = self._services.metadata.get_run(job.run_id)
        return run is not None and run.status == RunStatus.CANCELLED

    def _interrupted(self, job: Job) -> str:
        """Record the run interrupted, now, by an interrupt in its process; what happened, in words.
        The batches in flight are left to end with their calls: what they finish stays done."""
        resumes = "the next cognify resumes its work"
        try:
            run = self._services.metadata.get_run(job.run_id)
            if run is not None:
                run.status, run.finished_at = RunStatus.INTERRUPTED, utcnow()
                run.error = f"stopped by an interrupt (Ctrl-C) in its process; {resumes}"
                self._services.metadata.save_run(run)
        except StoreError as error:  # its process is ending: `close_dead_runs` marks it later
            return f"run {job.run_id} interrupted (Ctrl-C), not recorded ({error}); {resumes}"
        return f"run {job.run_id} interrupted (Ctrl-C); {resumes}"

    def _stopped(self, job: Job) -> PipelineRun:
        """The cancelled run, its end set to now: when its last batch was recorded."""
        run = self._services.metadata.get_run(job.run_id)
        assert run is not None
        run.finished_at = utcnow()
        self._services.metadata.save_run(run)
        return run

    def _run_steps(self, job: Job) -> None:
        items: list[str] = []
        for index, step in enumerate(self._plan):
            if self._cancelled(job):
                raise _Cancelled
            if step.fan_out:
                streamed = streamed_after(self._plan, index)
                # Each batch is recorded as it ends, so a killed run keeps what it spent.
                self._fan_out(step, job, items, streamed)
                continue
            passes = self._passes.pop(step.name, None)
            with reporting(passes or self._progress) as reported:
                result = step.run(self._services, job, items)
            record_step(self._services, job, step.name, result.counts)
            if not reported.count and not (passes and passes.reported):
                self._progress(step.name, 1, 1)  # a step with no units of its own: one, done
            items = result.items

    def _fan_out(self, step: Step, job: Job, items: list[str], streamed: Step | None) -> None:
        config = self._services.config
        size = min(step.batch_size(config), max(1, len(items) // (BATCHES_PER_THREAD * self._concurrency)))
        batches = deque(chunked(items, size))
        pacer = Pacer(self._rpm, self._concurrency, window=window_of(self._services.extractor))
        client = self._metered() if batches else None
        if client is not None:
            pacer.follow(client)

        def record(counts: dict[str, int]) -> None:
            record_step(self._services, job, step.name, counts)

        self._progress(step.name, 0, len(items))
        done = 0
        with (
            _Pool(max_workers=self._concurrency, thread_name_prefix=step.name) as pool,
            _Pool(max_workers=1, thread_name_prefix="stream") as writer,
        ):
            passes = _Passes(self._progress)
            if streamed is not None:
                self._passes[streamed.name] = passes
            every = max(1, config.load_batch // 4)
            stream = _Stream(self._services, job, streamed, writer, every, record, passes)
            # Under a rate limit the writer keeps up, and a pass held back near the end is meant to be.
            stream.behind_at = 0 if self._rpm else BEHIND_BATCHES * config.load_batch
            if batches:
                stream.prepare()
            running = _InFlight()
            while batches or running:
                # Batches in flight are answered at once (no rate limit): they count as waiting.
                while batches and len(running) < stream.allowed(pacer.limit, running.items_sent):
                    batch = batches.popleft()
                    running.sent(pool.submit(step.run, self._services, job, batch), len(batch))
                finished, _ = wait([*running, *stream.running], return_when=FIRST_COMPLETED)
                count = 0
                for future in (future for future in finished if future in running):
                    count += running.answered(future)
                    record(future.result().counts)
                    self._progress(step.name, done + count, len(items))
                    if client is not None:
                        pacer.follow(client)
                done += count
                if count and batches and self._cancelled(job):
                    batches.clear()  # those in flight are answered and recorded; no more are sent
                # Under a rate limit a pass mostly waits: its embeddings queue behind the
                # extractions at the limiter, then take a round trip. Without one it mostly
                # writes, and holding it back would only leave the writer idle.
                left_s = running.left_s(len(batches)) if self._rpm else None
                stream.advance(count, left_s, running.mean_s)  # also when only the pass ended
            stream.finish()

    def _metered(self) -> Metered | None:
        if not self._rpm:
            return None
        extractor = self._services.extractor
        return extractor if isinstance(extractor, Metered) else None


class _Stream:
    """Runs a step pass after pass on one writer thread, one pass at a time, each time `every`
    more items are ready; `record` gets each pass's counters, on the caller's thread. A small
    `every` leaves little for the pass after the fan-out, which nothing overlaps."""

    def __init__(
        self,
        services: Services,
        job: Job,
        step: Step | None,
        writer: ThreadPoolExecutor,
        every: int,
        record: Callable[[dict[str, int]], None],
        passes: _Passes | None = None,
    ) -> None:
        self._services = services
        self._passes = passes
        self._job = job
        self._step = step
        self._writer = writer
        self._every = every
        self._record = record
        self._ready = 0
        self._pass: Future[StepResult] | None = None
        self._pass_s = 0.0  # how long the last pass took (0: none ran yet)
        self.behind_at = 0  # items waiting for a pass that make the stream behind (0: never)
        self._preparation: Future[StepResult] | None = None

    def prepare(self) -> None:
        """Start the step's preparation, if it has one, on the writer: passes wait for it as for
        a pass, but it is neither recorded nor counted as one."""
        if self._step is not None and self._step.prepare is not None and self._pass is None:
            self._pass = self._preparation = self._writer.submit(self._prepare, self._step.prepare)

    @property
    def running(self) -> list[Future[StepResult]]:
        """The pass not yet recorded (running, or ended since the last `advance`), if any."""
        return [self._pass] if self._pass is not None else []

    def allowed(self, limit: int, coming: int = 0) -> int:
        """The batches the fan-out may have in flight, up to `limit`, as the items waiting for a
        pass stand (counting `coming` more that will be ready soon): all of them while fewer than
        `behind_at` wait; one, so the process keeps working while the writer waits on a store,
        until twice that many wait; none beyond."""
        waiting = self._ready + coming
        if self._step is None or not self.behind_at or waiting < self.behind_at or self._pass is None:
            return limit  # an idle writer starts a pass at once
        return 1 if waiting < 2 * self.behind_at else 0

    def advance(self, ready: int, left_s: float | None = None, batch_s: float = 0.0) -> None:
        """`ready` more items are ready: start a pass if enough are and none is running. With
        `left_s`, the seconds the fan-out is expected to go on, only a pass expected to end by
        then (taking as long as the last pass, or before any ran as a batch, `batch_s`): one that
        would end later only delays the pass after the fan-out, which holds everything left."""
        if self._step is None:
            return
        self._ready += ready
        if self._pass is not None:
            if not self._pass.done():
                return
            self.finish()
        if self._ready >= self._every and (left_s is None or left_s > (self._pass_s or batch_s)):
            self._ready = 0
            self._pass = self._writer.submit(self._run_pass, self._step)

    def finish(self) -> None:
        """Wait for the running pass, if any, and record it."""
        if self._pass is not None:
            running, self._pass = self._pass, None
            result = running.result()
            if running is self._preparation:
                return
            self._record(result.counts)
            if self._passes is not None:
                self._passes.next_pass()

    def _prepare(self, prepare: Callable[[Services, Job], None]) -> StepResult:
        prepare(self._services, self._job)
        return StepResult()

    def _run_pass(self, step: Step) -> StepResult:
        started = time.monotonic()
        try:
            with reporting(self._passes) if self._passes is not None else nullcontext():
                return step.run(self._services, self._job, [])
        finally:
            self._pass_s = time.monotonic() - started


class _InFlight(dict[Future[StepResult], tuple[int, float]]):
    """A fan-out's batches in flight (their items, when each was sent), and how long batches
    take on average from being sent to being answered."""

    def __init__(self) -> None:
        super().__init__()
        self._seconds, self._answered = 0.0, 0

    def sent(self, batch: Future[StepResult], items: int) -> None:
        self[batch] = (items, time.monotonic())

    def answered(self, batch: Future[StepResult]) -> int:
        """Forget the batch; returns its items."""
        items, sent = self.pop(batch)
        self._seconds, self._answered = self._seconds + time.monotonic() - sent, self._answered + 1
        return items

    @property
    def items_sent(self) -> int:
        """The items of the batches in flight."""
        return sum(items for items, _ in self.values())

    @property
    def mean_s(self) -> float:
        return self._seconds / max(1, self._answered)

    def left_s(self, queued: int) -> float | None:
        """Seconds until the last batch is expected to be answered: with `queued` batches still to
        send, once they are sent (as batches in flight are answered, by Little's law) and answered;
        else once the last batch sent is answered; 0 when none is left. None when it cannot be
        told: nothing answered yet, or the batches in flight are late by more than `LATE_S` or a
        batch's time (waiting out a retry's back-off, say)."""
        if not self and not queued:
            return 0.0
        if not self._answered or not self:
            return None
        mean = self.mean_s
        if queued:
            return queued * mean / len(self) + mean
        left = max(sent for _, sent in self.values()) + mean - time.monotonic()
        return left if left > -max(mean, LATE_S) else None


class _Passes:
    """The progress of a step run pass after pass, as one count: each pass's `done` of `total`
    comes after the units of the passes before it."""

    def __init__(self, progress: ProgressCallback) -> None:
        self._progress = progress
        self._before = 0
        self._total = 0
        self.reported = False

    def __call__(self, step: str, done: int, total: int) -> None:
        self._total, self.reported = total, True
        self._progress(step, self._before + done, self._before + total)

    def next_pass(self) -> None:
        self._before += self._total
        self._total = 0
