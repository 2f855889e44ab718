"""A task that lost its dataset lock writes nothing to its run's record either."""

from __future__ import annotations

import pytest

from kenning.pipeline.errors import LockLost
from kenning.pipeline.locking import fenced
from kenning.pipeline.models import RunStatus, Scope
from kenning.pipeline.plan import finish_run, record_step, start_run
from tests.twins import TwinServices


def lost() -> None:
    raise LockLost("another run holds the lock")


def test_a_step_or_the_end_of_a_run_is_not_recorded_past_a_lost_lock() -> None:
    # Given a run that recorded its first step
    services = TwinServices()
    job = start_run(services, Scope(tenant="t", dataset="d"))
    record_step(services, job, "classify", {"documents": 2})

    # When its task's fence says the lock is lost, neither a step nor the run's end is written
    with fenced(lost):
        with pytest.raises(LockLost):
            record_step(services, job, "chunk", {"chunks": 5})
        with pytest.raises(LockLost):
            finish_run(services, job)

    # Then the record is as it was
    run = services.metadata.get_run(job.run_id)
    assert run is not None
    assert (run.status, run.step, run.stats.get("chunks")) == (RunStatus.STARTED, "classify", None)
