"""The supervisor's decisions on one run, in process: the real Redis (leases, lock), SQLite metadata.

What the workers do around it (tasks renewing leases, the follower moving to the resuming
run) is in test_faults.py; here each case is set up by hand, with leases a fraction of a
second long, and the resuming run is taken note of instead of being sent to workers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from kenning.pipeline.context import Job
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import DISTRIBUTED, EMBEDDED, PipelineRun, RunStatus, Scope
from kenning.pipeline.plan import record_step, start_run
from kenning.workers.celery.app import Resources, queue_name
from kenning.workers.celery.supervisor import RESUMES, run_leases, stall_reason, supervise, supervise_dataset
from kenning.workers.celery.tasks import record_failure
from kenning.workers.runtime.local_runner import EMBEDDED_PID
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import forget_keys
from tests.services import free_port

pytestmark = [pytest.mark.redis]

LEASE_S = 0.3


@pytest.fixture
def resources(tmp_path: Path, redis_url: str) -> Iterator[Resources]:
    prefix = f"kenning-test-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        home=str(tmp_path / "home"),
        tenant=f"t-{uuid.uuid4().hex[:8]}",
        embedding_provider="hash",
        redis_url=redis_url,
        broker_url=redis_url,
        result_backend=redis_url,
        queue_prefix=prefix,
        lease_s=LEASE_S,
    )
    opened = Resources(settings)
    try:
        yield opened
    finally:
        opened.close()
        forget_keys(redis_url, prefix)


def started(resources: Resources, *, holding: bool = True, mode: str = DISTRIBUTED) -> Job:
    """A run that began: it holds the dataset lock and a lease on one batch."""
    job = start_run(resources.wiring, Scope(tenant=resources.settings.tenant, dataset="docs"), mode=mode)
    if holding:
        assert resources.lock.take(lock_name(job.scope), job.run_id, 600) is not None
    resources.leases.renew(job.run_id, "extract:c1", LEASE_S)
    return job


def run_of(resources: Resources, job: Job) -> PipelineRun:
    run = resources.wiring.metadata.get_run(job.run_id)
    assert run is not None
    return run


def expire(resources: Resources, job: Job) -> None:
    """Wait until the lease store says every lease of the run has expired (bounded)."""
    deadline = time.monotonic() + 10
    while not resources.leases.state(job.run_id).dead:
        assert time.monotonic() < deadline, f"the leases of {job.run_id} did not expire"
        time.sleep(LEASE_S / 10)


def test_a_run_whose_leases_expired_is_interrupted_its_lock_freed_and_its_work_resumed(
    resources: Resources,
) -> None:
    # Given a run holding the dataset lock and a lease
    job, sent = started(resources), list[Job]()
    name = lock_name(job.scope)

    # While its lease is live, the supervisor leaves it alone
    assert supervise(resources, sent.append) == {}
    assert run_of(resources, job).status == RunStatus.STARTED

    # When its lease expires (its worker is gone)
    expire(resources, job)
    assert "leases expired" in stall_reason(run_leases(resources, job.run_id))
    done = supervise(resources, sent.append)

    # Then it is interrupted, naming why and the run that resumes it, which is sent to the workers
    [successor] = sent
    assert done == {job.run_id: f"interrupted; resumed by {successor.run_id}"}
    run = run_of(resources, job)
    assert run.status == RunStatus.INTERRUPTED and run.finished_at is not None
    assert "leases expired" in run.error and successor.run_id in run.error
    assert run_of(resources, successor).status == RunStatus.STARTED
    assert run_of(resources, successor).stats[RESUMES] == 1
    # And the lock is free at once, not after its ttl
    assert resources.lock.holder(name) is None
    # And the new run, whose tasks have not shown up yet, gets a lease of grace, not an interruption
    assert supervise(resources, sent.append) == {}
    assert run_leases(resources, successor.run_id).live == ["grace@supervisor"]


def test_a_failure_recorded_while_the_metadata_store_was_away_ends_the_run_errored(
    resources: Resources,
) -> None:
    # Given a run whose task failed while the metadata store was away: `kenning.fail` kept the
    # error beside its leases
    job, sent = started(resources), list[Job]()
    resources.leases.note_failure(job.run_id, "TransientStoreError: metadata store: connection refused")

    # When its leases expire and the supervisor looks
    expire(resources, job)
    assert supervise(resources, sent.append) == {job.run_id: "errored"}

    # Then it ends errored with that failure, its lock free, and no run is started for it
    run = run_of(resources, job)
    assert run.status == RunStatus.ERRORED
    assert "connection refused" in run.error
    assert resources.lock.holder(lock_name(job.scope)) is None
    assert sent == []


def test_a_run_resumed_too_often_is_given_up(resources: Resources) -> None:
    # Given a run that resumed dead runs as many times as a message may be redelivered
    job, sent = started(resources), list[Job]()
    record_step(resources.wiring, job, "", {RESUMES: resources.settings.max_redeliveries})

    # When it dies too
    expire(resources, job)
    supervise(resources, sent.append)

    # Then it is errored, saying so, and not resumed again
    run = run_of(resources, job)
    assert run.status == RunStatus.ERRORED and "given up" in run.error
    assert sent == []


def test_an_embedded_run_is_left_to_its_runner(resources: Resources) -> None:
    # Given a run of the embedded runner (its mode says so) with no live lease
    job, sent = started(resources, holding=False, mode=EMBEDDED), list[Job]()
    record_step(resources.wiring, job, "begin", {EMBEDDED_PID: 1})
    expire(resources, job)

    # Then the supervisor leaves it alone
    assert supervise(resources, sent.append) == {}
    assert run_of(resources, job).status == RunStatus.STARTED


def test_a_run_waiting_for_the_lock_takes_over_from_a_dead_holder(resources: Resources) -> None:
    # Given a dead run holding the lock, and a new run of the same dataset waiting for it
    dead, sent = started(resources), list[Job]()
    expire(resources, dead)
    waiting = start_run(resources.wiring, Scope(tenant=resources.settings.tenant, dataset="docs"))

    # When the waiting run looks at its dataset's other runs
    done = supervise_dataset(resources, waiting, sent.append)

    # Then the dead one is interrupted, resumed by the waiting run (no third run), the lock free
    assert done == {dead.run_id: f"interrupted; resumed by {waiting.run_id}"}
    assert sent == []
    assert waiting.run_id in run_of(resources, dead).error
    assert resources.lock.take(lock_name(waiting.scope), waiting.run_id, 600) is not None


def test_a_run_failed_while_its_metadata_store_was_away_is_ended_errored_once_it_is_back(
    resources: Resources, tmp_path: Path
) -> None:
    # Given a run holding the lock, and a worker of it whose metadata store does not answer
    job = started(resources)
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/gone"
    away = resources.settings.model_copy(update={"metadata_url": nowhere})
    worker = Resources(away)

    # When a task of the run fails there, and its failure is recorded
    try:
        record_failure(worker, job, "TransientStoreError: metadata store: connection refused")
    finally:
        worker.close()

    # Then the lock is free at once, and the error is kept beside the run's leases
    assert resources.lock.holder(lock_name(job.scope)) is None
    assert "connection refused" in run_leases(resources, job.run_id).failure
    # And once the run's leases expire, the supervisor (its store back) ends the run errored with it
    expire(resources, job)
    assert supervise(resources, list[Job]().append) == {job.run_id: "errored"}
    run = run_of(resources, job)
    assert run.status == RunStatus.ERRORED and "connection refused" in run.error


def test_a_run_whose_tasks_wait_in_the_broker_is_not_dead(resources: Resources) -> None:
    # Given a run whose leases expired while one of its task messages waits in the broker (no
    # worker consumes this deployment's queues): a chord's body, whose long results come first,
    # sent by another service's Celery app
    job, sent = started(resources), list[Job]()
    settings = resources.settings
    message = {"job": job.model_dump(mode="json"), "items": [], "counts": {}}
    results = [{"extractions": 1, "note": "x" * 4000}]
    sender = Celery("elsewhere", broker=settings.broker_url, set_as_current=False)
    queue = queue_name(settings, "pipeline")
    sender.send_task("kenning.gather", args=(results, message), kwargs={"step": "extract"}, queue=queue)
    expire(resources, job)

    # Then the message names its run, and the supervisor leaves the run alone
    assert resources.waiting(job.run_id) == 1
    assert resources.waiting(str(uuid.uuid4())) == 0
    assert supervise(resources, sent.append) == {}
    assert run_of(resources, job).status == RunStatus.STARTED and not sent

    # When the broker loses the message, the run is dead and resumed
    redis.Redis.from_url(settings.broker_url).delete(queue)
    assert resources.waiting(job.run_id) == 0
    assert job.run_id in supervise(resources, sent.append)
