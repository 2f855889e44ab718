"""Celery task shells of the pipeline plan: decode the ids, run one plan step, pass small counters on.

A run is one chain, built from `pipeline.plan.PLAN` by `workers.canvas`:

    kenning.begin -> kenning.<step> ... -> kenning.fan_out -> ... -> kenning.finish

`begin` takes the dataset lock and every later message carries its fencing token; each
task extends the lock while it works and aborts the run with `LockLost` when the lock is
no longer its own. A fan-out step's task replaces itself with a flat chord: one
`kenning.<step>` task per batch of item ids, then `kenning.gather`, which records the
merged counters and lets the chain go on. `kenning.fail`, linked as the error callback of
every task, marks the run errored and releases the lock.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import chord
from celery.exceptions import CPendingDeprecationWarning
from pydantic import BaseModel, Field

from pipeline.context import Job
from pipeline.errors import LockLost, TransientLLMError, TransientStoreError
from pipeline.locking import LockBusy, lock_name
from pipeline.models import RunStatus
from pipeline.plan import PLAN, STEPS, Step, StepResult, fail_run, finish_run, merge_counts, record_step
from pipeline.ports import chunked
from storage.lock import RedisLock
from workers.celery_app import Resources, app

# A transient store or LLM failure is retried a bounded number of times, with backoff.
RETRY: dict[str, Any] = {
    "autoretry_for": (TransientStoreError, TransientLLMError),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 5,
}
LOCK_POLL_S = 1.0


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
    try:
        token = resources.lock.acquire(name, resources.settings.lock_ttl_s)
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

        app.task(run_batch, bind=True, name=f"kenning.{step.name}", **RETRY)
        return

    def run_step(self: Any, state: dict[str, Any]) -> dict[str, Any]:
        message, resources = Message.model_validate(state), app.resources()
        with holding(resources, message):
            result = step.run(resources.wiring, message.job, message.items)
            record_step(resources.wiring, message.job, step.name, result.counts)
        return message.model_copy(update={"items": result.items, "counts": result.counts}).encode()

    app.task(run_step, bind=True, name=f"kenning.{step.name}", **RETRY)


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
    resources.lock.release(lock_name(message.job.scope), message.token)
    return run.stats


def fail(request: Any, exc: BaseException, _traceback: Any, job: dict[str, Any]) -> None:
    """Error callback of every task of a run: mark the run errored, release the lock if it was taken.

    Celery calls it in the failing worker with the failed task's request, whose message
    argument carries the lock's fencing token once `begin` has taken it.
    """
    parsed, resources = Job.model_validate(job), app.resources()
    run = resources.wiring.metadata.get_run(parsed.run_id)
    # Several batches of one fan-out may fail; the first error is the one to keep.
    if run is not None and run.status not in (RunStatus.ERRORED, RunStatus.COMPLETED):
        fail_run(resources.wiring, parsed, f"{type(exc).__name__}: {exc}")
    token = _token_of(request)
    if token:
        resources.lock.release(lock_name(parsed.scope), token)


def _token_of(request: Any) -> int:
    for arg in getattr(request, "args", None) or ():
        if isinstance(arg, dict) and isinstance(arg.get("token"), int):
            return int(arg["token"])
    return 0


@contextmanager
def holding(resources: Resources, message: Message) -> Iterator[None]:
    """Extend the run's lock now, and every third of its ttl while the block runs.

    Raises `LockLost` when the lock is no longer held with the message's token: it expired,
    or another run took it, so this run must stop.
    """
    lock, name, ttl = resources.lock, lock_name(message.job.scope), resources.settings.lock_ttl_s
    if not lock.extend(name, message.token, ttl):
        raise LockLost(f"{name} is no longer held by run {message.job.run_id} (token {message.token})")
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(lock, name, message.token, ttl, stop), daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join(timeout=5.0)


def _heartbeat(lock: RedisLock, name: str, token: int, ttl_s: float, stop: threading.Event) -> None:
    while not stop.wait(ttl_s / 3):
        try:
            if not lock.extend(name, token, ttl_s):
                return
        except TransientStoreError:
            continue


# The task table: every name a message can carry. Registered by call, not decorator, so the
# functions keep their types.
app.task(begin, bind=True, name="kenning.begin")
for _step in PLAN:
    register_step(_step)
app.task(fan_out, bind=True, name="kenning.fan_out", **RETRY)
app.task(gather, bind=True, name="kenning.gather", **RETRY)
app.task(finish, bind=True, name="kenning.finish", **RETRY)
app.task(fail, name="kenning.fail")
