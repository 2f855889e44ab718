"""Celery task shells of the pipeline plan: decode the ids, run one plan step, pass small counters on.

A run is one chain, built from `kenning.pipeline.plan.PLAN` by `kenning.workers.celery.canvas`:

    kenning.begin -> kenning.<step> ... -> kenning.fan_out -> ... -> kenning.finish

`begin` takes the dataset lock for the run and every later message carries the fencing
token it was last held under; each task holds the lock while it works, checks it under
its token before each store write batch (see `holding`), and aborts the run with
`LockLost` when another run has it. A fan-out
step's task replaces itself with a flat chord: one `kenning.<step>` task per batch of item
ids, each followed (when the step after the fan-out streams, as load does) by that step's
`kenning.<next>_part` over what the batch finished, then `kenning.gather`, which records the
merged counters and lets the chain go on. A batch task runs its items at once, under the
worker process's call slots (`kenning.workers.celery.paced`).
`kenning.fail`, linked as the error callback of every task, marks the run errored and
releases the lock; with the metadata store away, it records the failure beside the run's
leases instead, and the supervisor ends the run once the store is back.

Each task holds a lease on its unit of work while it runs (`kenning.pipeline.lease`), renewed with
the lock by its heartbeat; a run whose leases have all expired is dead, and the supervisor
(`kenning.workers.celery.supervisor`) interrupts it and resumes its work, whatever became of its messages.
A store that is away (the metadata store, the graph or vector store, Redis) is ridden out:
the task's work is tried again with backoff for `store_retry_s` before the task gives up.

Tasks are acknowledged when done, so the task of a worker that died is delivered again;
redeliveries are counted, and a task redelivered more than `max_redeliveries` times (a
poison message) fails the run with `Redelivered` instead of coming back forever.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from celery import Task, chain, chord
from celery.exceptions import CPendingDeprecationWarning
from pydantic import BaseModel, Field

from kenning.pipeline.context import Job
from kenning.pipeline.errors import KenningError, LockLost, StoreError, TransientLLMError, TransientStoreError
from kenning.pipeline.locking import LockBusy, fenced, lock_name
from kenning.pipeline.models import ENDED
from kenning.pipeline.plan import (
    PLAN,
    STEPS,
    Step,
    StepResult,
    fail_run,
    finish_run,
    merge_counts,
    record_step,
    streamed_after,
)
from kenning.pipeline.ports import chunked
from kenning.storage.coordination.run_lock import Deliveries
from kenning.workers.celery.app import Resources, app
from kenning.workers.celery.paced import run_paced
from kenning.workers.celery.supervisor import supervise_dataset

log = logging.getLogger(__name__)

# A transient LLM failure is retried a bounded number of times, with backoff; a store that is
# away is ridden out in the task itself (`riding_out`): retrying through the broker needs it up.
RETRY: dict[str, Any] = {
    "autoretry_for": (TransientLLMError,),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 5,
}
LOCK_POLL_S = 1.0
# How long a fenced write waits for the lock's Redis to answer before its task fails (and retries).
FENCE_WAIT_S = 60.0
# Backoff between tries of a task's work while a store is away: from the first to the last.
RIDE_OUT_FIRST_S = 0.5
RIDE_OUT_MAX_S = 8.0
# A waiting begin looks for a dead holder of its lock every this many tries.
LOOK_FOR_DEAD_EVERY = 5

T = TypeVar("T")


class Redelivered(KenningError):
    """A task was delivered more often than `max_redeliveries` allows: a poison message, given up."""


class Message(BaseModel):
    """What one task of a run hands the next: ids and counters, never text."""

    job: Job
    token: int = 0
    items: list[str] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)

    def encode(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def begin(self: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Take the dataset lock for the run; while another run holds it, try again (bounded wait).

    While it waits, the run's `begin` lease is renewed at each try; a holder whose run is dead
    (its leases expired) is interrupted at once, so the new run never waits out its lock's ttl.
    """
    parsed = Job.model_validate(job)
    resources = app.resources()
    name = lock_name(parsed.scope)
    retry = {"countdown": LOCK_POLL_S, "max_retries": int(resources.settings.lock_wait_s / LOCK_POLL_S)}

    def take() -> int | None:
        _renew(resources, parsed, "begin")
        run = resources.wiring.metadata.get_run(parsed.run_id)
        if run is None or run.status in ENDED:
            # A begin delivered again after its run ended must not start the run over.
            raise LockLost(f"{name}: run {parsed.run_id} has ended, its tasks stop")
        token = resources.lock.take(name, parsed.run_id, resources.settings.lock_ttl_s)
        if token is None and int(self.request.retries or 0) % LOOK_FOR_DEAD_EVERY == 0:
            if _took_over_dead_runs(resources, parsed):
                token = resources.lock.take(name, parsed.run_id, resources.settings.lock_ttl_s)
        return token

    token = riding_out(resources, f"begin of run {parsed.run_id}", take)
    if token is None:
        raise self.retry(exc=LockBusy(f"{name} is held by another run"), **retry)
    return Message(job=parsed, token=token).encode()


def _took_over_dead_runs(resources: Resources, job: Job) -> bool:
    """Interrupt the dataset's other runs that are dead (one may hold the lock); whether any was."""
    try:
        return bool(supervise_dataset(resources, job))
    except TransientStoreError:
        raise
    except Exception:
        # Taking over is a shortcut: the supervisor's own passes do it anyway.
        log.exception("run %s: looking for dead runs of its dataset failed", job.run_id)
        return False


def register_step(step: Step) -> None:
    """One task per plan step: `kenning.<name>`; for a fan-out step it is the task of one batch."""
    if step.fan_out:

        def run_batch(self: Any, state: dict[str, Any], items: list[str]) -> dict[str, int]:
            message, resources = Message.model_validate(state), app.resources()
            unit = f"{step.name}:{items[0] if items else ''}"

            def work() -> dict[str, int]:
                with holding(resources, message, unit):
                    return run_paced(resources.slots, step, resources.wiring, message.job, items)

            counts = riding_out(resources, unit, work)
            flush_spend(resources, unit)
            return counts

        app.task(run_batch, bind=True, name=f"kenning.{step.name}", base=RunTask, **RETRY)
        return
    if step.part is not None:
        register_part(step)

    def run_step(self: Any, state: dict[str, Any]) -> dict[str, Any]:
        message, resources = Message.model_validate(state), app.resources()

        def work() -> dict[str, Any]:
            with holding(resources, message, step.name) as token:
                result = step.run(resources.wiring, message.job, message.items)
                record_step(resources.wiring, message.job, step.name, result.counts)
            update = {"token": token, "items": result.items, "counts": result.counts}
            return message.model_copy(update=update).encode()

        done = riding_out(resources, step.name, work)
        flush_spend(resources, step.name)
        return done

    app.task(run_step, bind=True, name=f"kenning.{step.name}", base=RunTask, **RETRY)


def register_part(step: Step) -> None:
    """`kenning.<name>_part`: the step's part over one batch of the fan-out before it, chained
    after that batch; it passes on the batch's counters, with its own added."""

    def run_part(self: Any, done: dict[str, int], state: dict[str, Any], items: list[str]) -> dict[str, int]:
        message, resources = Message.model_validate(state), app.resources()
        unit = f"{step.name}_part:{items[0] if items else ''}"
        writing, claim = resources.writing(message.job.scope), resources.claiming(message.job.run_id)

        def work() -> dict[str, int]:
            with holding(resources, message, unit):
                return step.run_part(resources.wiring, message.job, items, writing, claim).counts

        counts = riding_out(resources, unit, work)
        return merge_counts([StepResult(counts=done), StepResult(counts=counts)])

    app.task(run_part, bind=True, name=f"kenning.{step.name}_part", base=RunTask, **RETRY)


def part_after(step: str) -> Step | None:
    """The step after the fan-out `step` that has a part to stream over its batches, if any."""
    streamed = streamed_after(PLAN, [each.name for each in PLAN].index(step))
    return streamed if streamed is not None and streamed.part else None


def fan_out(self: Any, state: dict[str, Any], step: str) -> Any:
    """Replace this task with a chord: the step's task over batches of the items, then `gather`."""
    message, resources = Message.model_validate(state), app.resources()

    def cut() -> list[list[str]]:
        with holding(resources, message, f"fan_out:{step}"):
            return list(chunked(message.items, STEPS[step].batch_size(resources.wiring.config)))

    batches = riding_out(resources, f"fan_out:{step}", cut)
    # A fan-out consumes its items: the messages after it carry none.
    carried = message.model_copy(update={"items": [], "counts": {}}).encode()
    if not batches:
        riding_out(resources, step, lambda: record_step(resources.wiring, message.job, step, {}))
        return carried
    # Each batch task has the error callback itself: when one fails, the chord does not call
    # the callbacks of the rest of the chain, which it runs as its body.
    errback = app.signature("kenning.fail", args=(message.job.model_dump(mode="json"),))
    streamed = part_after(step)

    def member(batch: list[str]) -> Any:
        """The batch's task, then the part of the streamed step over what it finished, if any."""
        batch_task = app.signature(f"kenning.{step}", args=(carried, batch)).on_error(errback)
        if streamed is None:
            return batch_task
        part = app.signature(f"kenning.{streamed.name}_part", args=(carried, batch)).on_error(errback)
        return chain(batch_task, part)

    header = [member(batch) for batch in batches]
    body = app.signature("kenning.gather", args=(carried,), kwargs={"step": step})
    with warnings.catch_warnings():
        # The chain's error callbacks move to the chord's body, as wanted; Celery warns that
        # a later release may also link them to the header tasks.
        warnings.simplefilter("ignore", CPendingDeprecationWarning)
        return self.replace(chord(header, body))


def gather(self: Any, results: list[dict[str, int]], state: dict[str, Any], step: str) -> dict[str, Any]:
    """The chord's callback: record the merged counters of the batches as the step's."""
    message, resources = Message.model_validate(state), app.resources()
    counts = merge_counts([StepResult(counts=result) for result in results])

    def work() -> None:
        with holding(resources, message, f"gather:{step}"):
            record_step(resources.wiring, message.job, step, counts)

    riding_out(resources, f"gather:{step}", work)
    return message.model_copy(update={"counts": counts}).encode()


def finish(self: Any, state: dict[str, Any]) -> dict[str, int]:
    """Mark the run completed and release the dataset lock."""
    message, resources = Message.model_validate(state), app.resources()

    def work() -> dict[str, int]:
        with holding(resources, message, "finish"):
            run = finish_run(resources.wiring, message.job)
        resources.lock.release_run(lock_name(message.job.scope), message.job.run_id)
        return run.stats

    stats = riding_out(resources, "finish", work)
    _forget_leases(resources, message.job)
    return stats


def fail(request: Any, exc: BaseException, _traceback: Any, job: dict[str, Any]) -> None:
    """Error callback of every task of a run: mark the run errored, release the lock if the run holds it.

    Celery calls it in the failing worker with the failed task's request.
    """
    record_failure(app.resources(), Job.model_validate(job), f"{type(exc).__name__}: {exc}")


def record_failure(resources: Resources, job: Job, error: str) -> None:
    """End the run errored with `error` and release its lock, depending on no one store.

    When the metadata store cannot take the error (it may be the store that failed), the error
    is kept beside the run's leases, and the supervisor marks the run errored with it once the
    run's leases have expired and the store is back; when Redis is away, the lock is left to
    the supervisor too.
    """
    try:
        run = resources.wiring.metadata.get_run(job.run_id)
        # Several batches of one fan-out may fail; the first error is the one to keep.
        if run is not None and run.status not in ENDED:
            fail_run(resources.wiring, job, error)
        recorded = True
    except StoreError as store_error:
        log.warning("run %s failed (%s) but the metadata store is away: %s", job.run_id, error, store_error)
        recorded = False
        try:
            resources.leases.note_failure(job.run_id, error)
        except TransientStoreError as lease_error:
            log.warning("run %s: its failure could not be recorded anywhere: %s", job.run_id, lease_error)
    try:
        resources.lock.release_run(lock_name(job.scope), job.run_id)
    except TransientStoreError as lock_error:
        log.warning("run %s: its lock is left to the supervisor: %s", job.run_id, lock_error)
    if recorded:
        _forget_leases(resources, job)


def riding_out(resources: Resources, what: str, work: Callable[[], T]) -> T:
    """`work()`, tried again with backoff while a store is away, for `store_retry_s` at most.

    The work of a task is idempotent (ids are deterministic, writes are upserts, statuses say
    what is done), so it is simply done again once the store is back.
    """
    deadline = time.monotonic() + resources.settings.store_retry_s
    delay = RIDE_OUT_FIRST_S
    while True:
        try:
            return work()
        except TransientStoreError as error:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: a store is away, tried again in %.1f s: %s", what, delay, error)
            time.sleep(delay)
            delay = min(delay * 2, RIDE_OUT_MAX_S)


def flush_spend(resources: Resources, what: str) -> None:
    """Write the LLM spend held while the metadata store was away before the task returns, so
    the run's spend is whole when it ends; riding out an outage, then logging it: bookkeeping
    does not fail work that is done."""
    try:
        riding_out(resources, f"{what}: spend ledger", resources.wiring.flush_spend)
    except StoreError as error:
        held = resources.wiring.spend.held
        log.error("%s: LLM spend still held, not written (%d writes): %s", what, held, error)


@contextmanager
def holding(resources: Resources, message: Message, unit: str) -> Iterator[int]:
    """Hold the run's dataset lock and its lease on `unit` now, and renew both while the block
    runs (every third of the lease, and of the lock's ttl); yields the lock's token.

    The rule: a task may work while the lock is held by its run, under any token (all the tasks
    of a run hold it together). When the lock is free, because every task that extended it died
    (a killed worker) and it expired, a task of a run that has not ended takes it again for its
    run, with a new, larger fencing token, and goes on: a redelivered task continues its run.
    When another run holds it, the task raises `LockLost` and its run ends errored. A run only
    ever takes a free lock, never one that another run holds, and a run that has ended never
    takes it again.

    Each store write batch of the step, and the step's record in its run (and the run's end), is
    fenced: right before it, the lock must still be held
    by the task's run (under the task's token, or one its run took since), or be free and be
    taken again for the run, else the batch is not written and the task raises `LockLost`. So
    a task whose process stopped past the ttl (SIGSTOP, a long pause, a partitioned host) while
    another run took the expired lock writes nothing more when it resumes. The window that remains:
    a pause between the check and the write it guards (one Redis round trip apart), and the
    extraction cache, which is written unfenced since an answer serves any run.

    The lease is renewed once more as the block ends and left to expire: it covers the
    hand-over to the run's next message, which renews a lease of its own when it starts.
    """
    _renew(resources, message.job, unit)
    held_under = [hold(resources, message)]
    name = lock_name(message.job.scope)

    def check() -> None:
        holder = _holder(resources, name)
        if holder == held_under[0]:
            return
        try:
            # The run may hold it under a newer token (another of its tasks took it again), or it
            # may be free (expired, or Redis lost its data): the run takes it again, as a heartbeat.
            held_under[0] = hold(resources, message)
        except LockLost as lost:
            raise LockLost(
                f"{name} is no longer held under token {held_under[0]} (now {holder}): "
                f"run {message.job.run_id} stops before writing"
            ) from lost

    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(resources, message, unit, stop, held_under), daemon=True)
    beat.start()
    try:
        with fenced(check):
            yield held_under[0]
    finally:
        stop.set()
        beat.join(timeout=5.0)
        try:
            _renew(resources, message.job, unit)
        except TransientStoreError as error:
            log.warning("lease %s of run %s not renewed at its end: %s", unit, message.job.run_id, error)


def _renew(resources: Resources, job: Job, unit: str) -> None:
    resources.leases.renew(job.run_id, unit, resources.settings.lease_s)


def _forget_leases(resources: Resources, job: Job) -> None:
    """An ended run's leases, and its load parts' claims on chunks."""
    resources.forget_claims(job.run_id)
    try:
        resources.leases.forget(job.run_id)
    except TransientStoreError as error:
        log.warning("leases of ended run %s left to expire: %s", job.run_id, error)


def _holder(resources: Resources, name: str) -> int | None:
    """The lock's token, waiting out a Redis that went away: a write goes on only once confirmed."""
    deadline = time.monotonic() + FENCE_WAIT_S
    while True:
        try:
            return resources.lock.holder(name)
        except TransientStoreError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(LOCK_POLL_S)


def hold(resources: Resources, message: Message) -> int:
    """The token under which the message's run holds the dataset lock, taken again if it was free."""
    lock, job, ttl = resources.lock, message.job, resources.settings.lock_ttl_s
    name = lock_name(job.scope)
    token = lock.keep(name, job.run_id, ttl)
    if token is not None:
        return token
    run = resources.wiring.metadata.get_run(job.run_id)
    if run is None or run.status in ENDED:
        raise LockLost(f"{name}: run {job.run_id} has ended, its tasks stop")
    token = lock.take(name, job.run_id, ttl)
    if token is None:
        raise LockLost(f"{name} is held by another run than {job.run_id}")
    log.warning("%s had expired; run %s took it again (token %d)", name, job.run_id, token)
    return token


def _heartbeat(
    resources: Resources, message: Message, unit: str, stop: threading.Event, held_under: list[int]
) -> None:
    settings = resources.settings
    period = min(settings.lock_ttl_s, settings.lease_s) / 3
    while not stop.wait(period):
        try:
            # The lease first: it says the task is alive, even while the metadata store is away.
            _renew(resources, message.job, unit)
            held_under[0] = hold(resources, message)
        except StoreError:
            continue
        except LockLost:
            return


class RunTask(Task):  # type: ignore[misc]  # celery ships no type hints
    """A task of a run: a redelivery is counted before the task starts (`check_redelivery`)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        if not (self.request.delivery_info or {}).get("redelivered"):
            return
        resources = app.resources()
        try:
            check_redelivery(
                resources.deliveries,
                self.name,
                task_id,
                int(self.request.retries or 0),
                resources.settings.max_redeliveries,
            )
        except TransientStoreError as error:
            # The count is best effort: with Redis away, the task's own lock call retries it.
            log.warning("delivery of %s [%s] not counted: %s", self.name, task_id, error)


def check_redelivery(deliveries: Deliveries, task: str, task_id: str, attempt: int, limit: int) -> None:
    """Count a redelivery of the task's attempt; raise `Redelivered` once there were more than `limit`.

    A task whose worker dies while running it (killed, out of memory) is delivered again
    after the broker's visibility timeout; one that brings its worker down every time would
    otherwise come back forever. A retry is a new attempt, counted on its own.
    """
    redelivered = deliveries.count(task_id, attempt)
    if redelivered > limit:
        raise Redelivered(
            f"task {task} [{task_id}] was redelivered {redelivered} times, more than the {limit} allowed "
            "(KENNING_MAX_REDELIVERIES): its worker was lost each time it ran it, so it is given up"
        )


# The task table: every name a message can carry. Registered by call, not decorator, so the
# functions keep their types.
app.task(begin, bind=True, name="kenning.begin", base=RunTask)
for _step in PLAN:
    register_step(_step)
app.task(fan_out, bind=True, name="kenning.fan_out", base=RunTask, **RETRY)
app.task(gather, bind=True, name="kenning.gather", base=RunTask, **RETRY)
app.task(finish, bind=True, name="kenning.finish", base=RunTask, **RETRY)
app.task(fail, name="kenning.fail")
