"""The supervisor of distributed runs: a run nobody works on any more is interrupted and resumed.

Progress is owned by the data: chunk and item statuses in the metadata store say what is left to do,
and the leases of the run's tasks (`kenning.pipeline.lease`, in Redis:
`kenning.storage.coordination.lease_redis`) say whether anyone still does it. A run that has not
ended and whose leases have all expired is dead, whatever became of its messages (a Redis that lost
its data, killed workers, batches left unacknowledged until the broker's visibility timeout), unless
some of its task messages still wait in the broker's queues (each names its run in a header): those
are behind other runs' work, not lost. The supervisor then

1. releases the dataset lock the run holds, so nothing waits out the lock's ttl behind it;
2. marks the run `interrupted`, saying why and which run resumes it;
3. resumes its work in a new run of the dataset (unless a newer run is already waiting for
   the lock, which will do it), sent to the workers like any cognify: the new run's steps
   pick up the chunks and items the dead one left, and pay for no extraction twice.

A run whose tasks recorded a failure here while the metadata store was away (`kenning.fail`)
is marked `errored` with that failure instead, and a run resumed `max_redeliveries` times
already is given up (errored): the next cognify, or `kenning.maintenance`, resumes its work.

Every worker runs the supervisor when it starts and every `supervise_every_s` after (a thread
of its main process); `kenning.maintenance` and the `kenning.supervise` task run it too. A
short claim in Redis makes one supervisor act on a dead run, however many look at it.
Embedded runs (which carry their process id) are left to the embedded runner.

For status and operator commands: `run_leases(resources, run_id)` and `stall_reason(state)`.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from celery.signals import worker_ready, worker_shutdown

from kenning.pipeline.context import Job
from kenning.pipeline.lease import LeaseState, stall_reason
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import ENDED, RUNNING, Dataset, PipelineRun, RunStatus, utcnow
from kenning.pipeline.plan import fail_run, record_step, start_run, successor_of
from kenning.workers.celery.app import Resources, app

log = logging.getLogger(__name__)

# How many resumes of resumes a dead run may have before it is given up (errored).
RESUMES = "resumes"

Send = Callable[[Job], None]

__all__ = ["run_leases", "stall_reason", "supervise", "supervise_dataset"]


def run_leases(resources: Resources, run_id: str) -> LeaseState:
    """The run's leases now; a run the lease store knows nothing of is given one lease of grace."""
    leases, lease_s = resources.leases, resources.settings.lease_s
    state = leases.state(run_id)
    if not state.known and leases.grant_grace(run_id, lease_s):
        state = leases.state(run_id)
    return state


def supervise(resources: Resources, send: Send | None = None) -> dict[str, str]:
    """Look at every run not ended, of every tenant; interrupt and resume the dead ones.

    A resuming run is sent to the workers with `send` (by default, as its Celery chain).
    Returns what was done, by run id (only the runs acted on).
    """
    done: dict[str, str] = {}
    for dataset, run in resources.wiring.metadata.list_running_runs():
        outcome = _supervise_run(resources, dataset, run, send or send_chain)
        if outcome:
            done[run.id] = outcome
    return done


def supervise_dataset(resources: Resources, job: Job, send: Send | None = None) -> dict[str, str]:
    """The same, for the dataset's other runs only: what a run waiting for the lock calls."""
    dataset = Dataset.of(job.scope)
    done: dict[str, str] = {}
    for run in resources.wiring.metadata.list_runs(job.dataset_id):
        if run.id != job.run_id and run.status in RUNNING:
            outcome = _supervise_run(resources, dataset, run, send or send_chain)
            if outcome:
                done[run.id] = outcome
    return done


def _supervise_run(resources: Resources, dataset: Dataset, run: PipelineRun, send: Send) -> str:
    if run.embedded:  # its own process runs it: `close_dead_runs` ends it when that dies
        return ""
    if not run_leases(resources, run.id).dead:
        return ""
    if resources.waiting(run.id):
        # Its tasks wait in the broker (behind other runs' work): nobody holds them yet.
        return ""
    if not resources.leases.claim(run.id, resources.settings.lease_s):
        return ""
    # Read both again under the claim: the run may have ended or come back to life meanwhile.
    current = resources.wiring.metadata.get_run(run.id)
    state = resources.leases.state(run.id)
    if current is None or current.status in ENDED or not state.dead:
        return ""
    return _end_dead_run(resources, dataset, current, state, send)


def _end_dead_run(
    resources: Resources, dataset: Dataset, run: PipelineRun, state: LeaseState, send: Send
) -> str:
    settings, metadata = resources.settings, resources.wiring.metadata
    job = Job(run_id=run.id, dataset_id=dataset.id, tenant=dataset.tenant, dataset=dataset.name)
    resources.lock.release_run(lock_name(job.scope), run.id)
    why = stall_reason(state)
    resumes = run.stats.get(RESUMES, 0)
    if state.failure or resumes >= settings.max_redeliveries:
        given_up = "" if state.failure else f"; resumed {resumes} times already, it is given up"
        fail_run(resources.wiring, job, f"{why}{given_up}")
        resources.leases.forget(run.id)
        log.warning("run %s of %s errored: %s", run.id, dataset.name, why)
        return "errored"
    successor = successor_of([r for r in metadata.list_runs(dataset.id) if r.status in RUNNING], run)
    if successor is None:
        successor_job = start_run(resources.wiring, dataset.scope)
        record_step(resources.wiring, successor_job, "", {RESUMES: resumes + 1})
        resumed_by = successor_job.run_id
    else:
        successor_job, resumed_by = None, successor.id
    run.status, run.finished_at = RunStatus.INTERRUPTED, utcnow()
    where = f"after step {run.step}" if run.step else "before its first step"
    run.error = f"interrupted {where}: {why}; run {resumed_by} resumes its work"
    metadata.save_run(run)
    resources.leases.forget(run.id)
    if successor_job is not None:
        send(successor_job)
    log.warning("run %s of %s interrupted (%s); run %s resumes it", run.id, dataset.name, why, resumed_by)
    return f"interrupted; resumed by {resumed_by}"


def send_chain(job: Job) -> None:
    """Send the run to the workers as its Celery chain."""
    # Imported here: the canvas draws progress with rich, which the task modules do not need.
    from kenning.workers.celery.canvas import run_chain

    run_chain(job).apply_async()


def supervise_task() -> dict[str, str]:
    """`kenning.supervise`: one pass of the supervisor (Celery beat may run it; workers run it anyway)."""
    return supervise(app.resources())


class Watch:
    """The supervisor's thread in a worker's main process: a pass at start, then one every period."""

    def __init__(self, resources: Resources) -> None:
        self._resources = resources
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kenning-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
        self._resources.close()

    def _loop(self) -> None:
        period = self._resources.settings.supervise_every_s
        wait = 0.0
        while not self._stop.wait(wait):
            try:
                done = supervise(self._resources)
            except Exception:
                # The thread must outlive any one pass: a store away now is back later.
                log.exception("supervisor pass failed; tried again in %.0f s", period)
            else:
                if done:
                    log.warning("supervisor: %s", done)
            # Spread the passes of many workers over the period.
            wait = period * random.uniform(0.75, 1.25)


_watch: list[Watch] = []


def _on_worker_ready(**_: Any) -> None:
    # Its own resources: the main process's connections must not be shared with forked children.
    watch = Watch(Resources(app.settings))
    watch.start()
    _watch.append(watch)


def _on_worker_shutdown(**_: Any) -> None:
    while _watch:
        _watch.pop().stop()


worker_ready.connect(_on_worker_ready, weak=False)
worker_shutdown.connect(_on_worker_shutdown, weak=False)
app.task(supervise_task, name="kenning.supervise")
