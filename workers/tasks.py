"""Celery task shells of the pipeline plan: decode the ids, run one plan step, pass small counters on.

A run is one chain, built from `pipeline.plan.PLAN` by `workers.canvas`:

    kenning.begin -> kenning.<step> ... -> kenning.fan_out -> ... -> kenning.finish

`begin` takes the dataset lock for the run and every later message carries the fencing
token it was last held under; each task holds the lock while it works, checks it under
its token before each store write batch (see `holding`), and aborts the run with
`LockLost` when another run has it. A fan-out
step's task replaces itself with a flat chord: one `kenning.<step>` task per batch of item
ids, then `kenning.gather`, which records the merged counters and lets the chain go on.
`kenning.fail`, linked as the error callback of every task, marks the run errored and
releases the lock.

Tasks are acknowledged when done, so the task of a worker that died is delivered again;
redeliveries are counted, and a task redelivered more than `max_redeliveries` times (a
poison message) fails the run with `Redelivered` instead of coming back forever.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task, chord
from celery.exceptions import CPendingDeprecationWarning
from pydantic import BaseModel, Field

from kenning.pipeline.context import Job
from kenning.pipeline.errors import KenningError, LockLost, TransientLLMError, TransientStoreError
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
)
from kenning.pipeline.ports import chunked
from kenning.storage.run_lock import Deliveries
from kenning.workers.celery_app import Resources, app

log = logging.getLogger(__name__)

# A transient store or LLM failure is retried a bounded number of times, with backoff.
RETRY: dict[str, Any] = {
    "autoretry_for": (TransientStoreError, TransientLLMError),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 5,
}
LOCK_POLL_S = 1.0
# How long a fenced write waits for the lock's Redis to answer before its task fails (and retries).
FENCE_WAIT_S = 60.0

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
    """Take the dataset lock for the run; while another run holds it, try again (bounded wait)."""
    parsed = Job.model_validate(job)
    resources = app.resources()
    name = lock_name(parsed.scope)
    retry = {"countdown": LOCK_POLL_S, "max_retries": int(resources.settings.lock_wait_s / LOCK_POLL_S)}
    run = resources.wiring.metadata.get_run(parsed.run_id)
    if run is None or run.status in ENDED:
        # A begin delivered again after its run ended must not start the run over.
        raise LockLost(f"{name}: run {parsed.run_id} has ended, its tasks stop")
    try:
        token = resources.lock.take(name, parsed.run_id, resources.settings.lock_ttl_s)
    except TransientStoreError as error:
        raise self.retry(exc=error, **retry) from error
    if token is None:
        raise self.retry(exc=LockBusy(f"{name} is held by another run"), **retry)
    return Message(job=parsed, token=token).encode()


def register_step(step: Step) -> None:
    """One task per plan step: `kenning.<name>`; for a fan-out step it is the task of one batch."""
    if step.fan_out:

        def run_batch(self: Any, state: dict[str, Any], items: list[str]) -> dict[str, int]:
            message, resources = Message.model_validate(state), app.resources()
            with holding(resources, message):
                return step.run(resources.wiring, message.job, items).counts

        app.task(run_batch, bind=True, name=f"kenning.{step.name}", base=RunTask, **RETRY)
        return

    def run_step(self: Any, state: dict[str, Any]) -> dict[str, Any]:
        message, resources = Message.model_validate(state), app.resources()
        with holding(resources, message) as token:
            result = step.run(resources.wiring, message.job, message.items)
            record_step(resources.wiring, message.job, step.name, result.counts)
        update = {"token": token, "items": result.items, "counts": result.counts}
        return message.model_copy(update=update).encode()

    app.task(run_step, bind=True, name=f"kenning.{step.name}", base=RunTask, **RETRY)


def fan_out(self: Any, state: dict[str, Any], step: str) -> Any:
    """Replace this task with a chord: the step's task over batches of the items, then `gather`."""
    message, resources = Message.model_validate(state), app.resources()
    with holding(resources, message):
        batches = list(chunked(message.items, STEPS[step].batch_size(resources.wiring.config)))
    # A fan-out consumes its items: the messages after it carry none.
    carried = message.model_copy(update={"items": [], "counts": {}}).encode()
    if not batches:
        record_step(resources.wiring, message.job, step, {})
        return carried
    # Each batch task has the error callback itself: when one fails, the chord does not call
    # the callbacks of the rest of the chain, which it runs as its body.
    errback = app.signature("kenning.fail", args=(message.job.model_dump(mode="json"),))
    header = [app.signature(f"kenning.{step}", args=(carried, batch)).on_error(errback) for batch in batches]
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
    with holding(resources, message):
        record_step(resources.wiring, message.job, step, counts)
    return message.model_copy(update={"counts": counts}).encode()


def finish(self: Any, state: dict[str, Any]) -> dict[str, int]:
    """Mark the run completed and release the dataset lock."""
    message, resources = Message.model_validate(state), app.resources()
    with holding(resources, message):
        run = finish_run(resources.wiring, message.job)
    resources.lock.release_run(lock_name(message.job.scope), message.job.run_id)
    return run.stats


def fail(request: Any, exc: BaseException, _traceback: Any, job: dict[str, Any]) -> None:
    """Error callback of every task of a run: mark the run errored, release the lock if the run holds it.

    Celery calls it in the failing worker with the failed task's request.
    """
    parsed, resources = Job.model_validate(job), app.resources()
    run = resources.wiring.metadata.get_run(parsed.run_id)
    # Several batches of one fan-out may fail; the first error is the one to keep.
    if run is not None and run.status not in ENDED:
        fail_run(resources.wiring, parsed, f"{type(exc).__name__}: {exc}")
    resources.lock.release_run(lock_name(parsed.scope), parsed.run_id)


@contextmanager
def holding(resources: Resources, message: Message) -> Iterator[int]:
    """Hold the run's dataset lock now, and every third of its ttl while the block runs; yields its token.

    The rule: a task may work while the lock is held by its run, under any token (all the tasks
    of a run hold it together). When the lock is free, because every task that extended it died
    (a killed worker) and it expired, a task of a run that has not ended takes it again for its
    run, with a new, larger fencing token, and goes on: a redelivered task continues its run.
    When another run holds it, the task raises `LockLost` and its run ends errored. A run only
    ever takes a free lock, never one that another run holds, and a run that has ended never
    takes it again.

    Each store write batch of the step is fenced: right before it, the lock must still be held
    under the task's token (the one it took, or the one its heartbeat last kept or took for
    its run), else the batch is not written and the task raises `LockLost`. So a task whose
    process stopped past the ttl (SIGSTOP, a long pause, a partitioned host) while another
    run took the expired lock writes nothing more when it resumes. The window that remains:
    a pause between the check and the write it guards (one Redis round trip apart), and the
    extraction cache, which is written unfenced since an answer serves any run.
    """
    held_under = [hold(resources, message)]
    name = lock_name(message.job.scope)

    def check() -> None:
        holder = _holder(resources, name)
        if holder != held_under[0]:
            raise LockLost(
                f"{name} is no longer held under token {held_under[0]} (now {holder}): "
                f"run {message.job.run_id} stops before writing"
            )

    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(resources, message, stop, held_under), daemon=True)
    beat.start()
    try:
        with fenced(check):
            yield held_under[0]
    finally:
        stop.set()
        beat.join(timeout=5.0)


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


def _heartbeat(resources: Resources, message: Message, stop: threading.Event, held_under: list[int]) -> None:
    while not stop.wait(resources.settings.lock_ttl_s / 3):
        try:
            held_under[0] = hold(resources, message)
        except TransientStoreError:
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
