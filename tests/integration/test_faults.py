"""Distributed runs never hang: lost workers, lost broker state and a metadata store outage.

Two `kenning worker` processes, the LLM simulator, the follower `kenning cognify --distributed`;
each fault lands mid-extraction (see `tests.integration.faults`). The broker's visibility
timeout (2 h) and the lock's ttl (10 min) keep their defaults: a test passes only if the run
recovers without waiting them out. The lease and the supervisor's period are shortened (10 s
and 5 s, against 60 s and 30 s by default) so that the three tests take about a minute each
on two cores; `bench/faults.py` runs the same faults with every default and times them.

Each ends with the follower exiting 0 and the last run completed, every chunk loaded, the
lock free, and the memory an undisturbed embedded run of the same corpus builds (the same
node, edge and vector point ids, none duplicated).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from kenning.pipeline.models import ChunkStatus, RunStatus
from tests.integration.cluster import Deployment, RedisServer, Workers, small_chunks
from tests.integration.faults import (
    Outcome,
    PostgresServer,
    chunk_counts,
    cognifying,
    dataset_id,
    kill_both,
    run_with_fault,
    stop_postgres,
    wipe_redis,
)
from tests.integration.test_chaos import add_corpus, assert_same_as_embedded, write_corpus
from tests.integration.test_distributed import lock_released
from tests.integration.test_spend import KILLED_TOLERANCE, KILLED_UNSENT, assert_spend, status_of
from tests.services import free_port
from tests.simulator import Simulator

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

LATENCY_MS = 300
SEED = 20261123
SHORT = {"lease_s": "10", "supervise_every_s": "5"}
# From the fault to the follower's exit: the lease, two supervisor passes and the rest of the run.
BOUND_S = 120.0
OUTAGE_S = 20.0


@pytest.fixture
def shared() -> dict[str, str]:
    """Small chunks from a small corpus; the embedded reference run uses the same settings."""
    return small_chunks()


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with Simulator(latency_ms=LATENCY_MS, seed=SEED) as running:
        yield running


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer(free_port())
    server.create()
    server.start()
    try:
        yield server
    finally:
        server.remove()


def configured(deployment: Deployment, simulator: Simulator, **values: str) -> Deployment:
    return deployment.configured(llm_url=simulator.base_url, llm_api_key="test", **{**SHORT, **values})


def assert_recovered(outcome: Outcome, workers: Workers, *, interrupted: bool) -> None:
    """The follower exited 0 within the bound; the last run completed with every chunk loaded,
    and a run before it, if any, was interrupted (visibly, naming its successor)."""
    detail = (
        f"{outcome.output[-3000:]}\n{[(r.id[:8], r.status, r.error) for r in outcome.runs]}\n{workers.logs()}"
    )
    assert outcome.code == 0, detail
    assert outcome.fault_to_end_s < BOUND_S, detail
    *before, last = outcome.runs
    assert last.status == RunStatus.COMPLETED, detail
    assert 0 < outcome.chunks[ChunkStatus.LOADED] == sum(outcome.chunks.values()), outcome.chunks
    assert [run.status for run in before] == ([RunStatus.INTERRUPTED] if interrupted else []), detail
    for run in before:
        assert "leases expired" in run.error and last.id in run.error, run.error


def test_both_workers_killed_mid_extraction_and_restarted_then_a_new_cognify_takes_over(
    deployment: Deployment,
    simulator: Simulator,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
    shared: dict[str, str],
) -> None:
    # Given two workers cognifying a corpus, with the default visibility timeout and lock ttl,
    # whose supervisor looks for dead runs only as they start
    corpus = write_corpus(tmp_path / "corpus", documents=8, sentences=12)
    faulty = configured(deployment, simulator, supervise_every_s="3600")
    add_corpus(faulty, corpus, "killed")
    workers = start_workers(faulty)

    # When both are killed with SIGKILL mid-extraction and started again, and a new cognify of
    # the dataset is sent at once
    with ExitStack() as stack:
        second: list[subprocess.Popen[bytes]] = []

        def fault() -> None:
            kill_both(workers)()
            second.append(stack.enter_context(cognifying(faulty, "killed", tmp_path))[0])

        outcome = run_with_fault(faulty, "killed", tmp_path, fault)
        second_code = second[0].wait(timeout=BOUND_S)

    # Then the new run does not wait out the dead run's lock (10 min) nor its batches (2 h):
    # once the dead run's leases expire it interrupts it, takes the lock, resumes its work and
    # completes; the first follower follows it to the end, and the lock is free
    assert_recovered(outcome, workers, interrupted=True)
    assert second_code == 0, workers.logs()
    assert lock_released(faulty, "killed")
    # And status counts every LLM call the provider saw: the killed tasks' and the retries too
    killed = status_of(faulty.env, "killed")
    assert_spend(killed, simulator.stats(), unsent=KILLED_UNSENT, completion_tolerance=KILLED_TOLERANCE)
    # And the memory is the one an undisturbed run builds
    workers.stop()
    assert_same_as_embedded(faulty, tmp_path, shared, corpus, "killed")


def test_redis_restarted_without_its_data(
    deployment: Deployment,
    simulator: Simulator,
    private_redis: RedisServer,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
    shared: dict[str, str],
) -> None:
    # Given workers whose broker, result backend, lock and leases live in a private Redis
    corpus = write_corpus(tmp_path / "corpus", documents=8, sentences=12)
    url = private_redis.url
    faulty = configured(deployment, simulator, broker_url=url, result_backend=url, redis_url=url)
    add_corpus(faulty, corpus, "wiped")
    workers = start_workers(faulty)

    # When Redis is killed mid-extraction and started again empty: queues, chord counts and
    # leases are gone
    outcome = run_with_fault(faulty, "wiped", tmp_path, wipe_redis(private_redis))

    # Then the run with no lease left is interrupted and resumed, and the resuming run completes
    assert_recovered(outcome, workers, interrupted=True)
    assert lock_released(faulty, "wiped")
    # And status counts every LLM call the provider saw: the killed tasks' and the retries too
    assert_spend(status_of(faulty.env, "wiped"), simulator.stats())
    workers.stop()
    assert_same_as_embedded(faulty, tmp_path, shared, corpus, "wiped")


def test_postgres_stopped_for_twenty_seconds(
    deployment: Deployment,
    simulator: Simulator,
    private_postgres: PostgresServer,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
    shared: dict[str, str],
) -> None:
    # Given workers whose metadata store is a private PostgreSQL
    corpus = write_corpus(tmp_path / "corpus", documents=8, sentences=12)
    faulty = configured(deployment, simulator, metadata_url=private_postgres.url)
    add_corpus(faulty, corpus, "outage")
    workers = start_workers(faulty)

    # When PostgreSQL stops mid-extraction for 20 s
    outcome = run_with_fault(faulty, "outage", tmp_path, stop_postgres(private_postgres, OUTAGE_S))

    # Then the tasks and the follower ride it out: the one run completes, nothing interrupted
    assert_recovered(outcome, workers, interrupted=False)
    assert lock_released(faulty, "outage")
    # And status counts every LLM call the provider saw: the killed tasks' and the retries too
    assert_spend(status_of(faulty.env, "outage"), simulator.stats())
    workers.stop()
    assert_same_as_embedded(faulty, tmp_path, shared, corpus, "outage")


def test_postgres_away_longer_than_the_ride_out_fails_the_run_visibly_and_a_new_cognify_completes_it(
    deployment: Deployment,
    simulator: Simulator,
    private_postgres: PostgresServer,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
    shared: dict[str, str],
) -> None:
    # Given workers that ride out an unreachable metadata store for 3 s only
    corpus = write_corpus(tmp_path / "corpus", documents=8, sentences=12)
    faulty = configured(deployment, simulator, metadata_url=private_postgres.url, store_retry_s="3")
    add_corpus(faulty, corpus, "long-outage")
    workers = start_workers(faulty)

    # When PostgreSQL stops mid-extraction for 20 s
    outcome = run_with_fault(faulty, "long-outage", tmp_path, stop_postgres(private_postgres, OUTAGE_S))

    # Then the follower does not report success, and names the store
    detail = f"{outcome.output[-3000:]}\n{[(r.id[:8], r.status, r.error) for r in outcome.runs]}"
    assert outcome.code != 0, detail
    assert "metadata" in outcome.output.lower(), detail

    # And a new cognify, once the store is back, does not wait out the failed run's lock: the
    # failed run is ended errored, naming the store, and the new run completes what it left
    again = faulty.cognify("long-outage")
    assert again.returncode == 0, f"{again.stdout[-2000:]}\n{again.stderr[-2000:]}\n{workers.logs()}"
    with faulty.memory() as memory:
        of_dataset = dataset_id(faulty, "long-outage")
        runs = sorted(memory.wiring.metadata.list_runs(of_dataset), key=lambda run: run.started_at)
        counts = chunk_counts(memory, of_dataset)
    *before, last = runs
    assert last.status == RunStatus.COMPLETED, [(r.status, r.error) for r in runs]
    assert [run.status for run in before] == [RunStatus.ERRORED], [(r.status, r.error) for r in runs]
    assert "metadata" in before[0].error.lower() or "postgres" in before[0].error.lower(), before[0].error
    assert 0 < counts[ChunkStatus.LOADED] == sum(counts.values()), counts
    assert lock_released(faulty, "long-outage")
    workers.stop()
    assert_same_as_embedded(faulty, tmp_path, shared, corpus, "long-outage")
