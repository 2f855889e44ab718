"""A fan-out batch on a worker: its items run at once, as many as the process's call slots admit.

One extraction unit is one LLM call, which mostly waits on the provider. A batch task that
made its calls one after another kept one call in flight per task; here each item of the
batch is a step run of its own, on a thread of the task, and the process's `Slots`
(`kenning.pipeline.pacing`) bound the calls in flight of all its tasks together: as many as
keep the shared rate limit busy at the latency observed, within `KENNING_CONCURRENCY`.

What holds per item holds as before: each run reads its chunks, goes through the extraction
cache, writes each answer to the cache the moment it comes, marks its chunks, and writes
behind the task's fence (the threads run in copies of the task's context). The first item
that raises stops the items not yet started, and the batch raises it once the others end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context

from kenning.pipeline.context import Job, Services
from kenning.pipeline.pacing import Slots
from kenning.pipeline.plan import Step, StepResult, merge_counts


def run_paced(slots: Slots, step: Step, services: Services, job: Job, items: Sequence[str]) -> dict[str, int]:
    """The batch's counters: each item run as a step of its own, under a slot."""
    if len(items) <= 1:
        with slots.taken():
            return step.run(services, job, items).counts
    stop = threading.Event()
    started = time.monotonic()  # the batch's rank: its items go before those of later batches

    def one(index: int, item: str) -> StepResult:
        if stop.is_set():
            return StepResult()
        try:
            with slots.taken((started, index)):
                if stop.is_set():
                    return StepResult()
                return step.run(services, job, [item])
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix=step.name) as pool:
        futures = [pool.submit(copy_context().run, one, index, item) for index, item in enumerate(items)]
    failed = next((future.exception() for future in futures if future.exception() is not None), None)
    if failed is not None:
        raise failed
    return merge_counts([future.result() for future in futures])
