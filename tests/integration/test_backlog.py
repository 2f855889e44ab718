"""A run whose tasks wait in the broker behind another run's backlog is alive, not dead.

One worker with one process takes every queue, so the second dataset's extract batches wait
behind the first's for much longer than a lease: no task of the second run holds a lease
meanwhile, but its messages are in the broker and will be delivered. The supervisor, which
looks every second, must leave it alone; both runs complete, neither is interrupted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kenning.pipeline.models import ChunkStatus, RunStatus
from tests.integration.cluster import Deployment, Workers, small_chunks
from tests.integration.faults import chunk_counts, cognifying, dataset_id, wait_for_extraction
from tests.integration.test_chaos import add_corpus, write_corpus
from tests.simulator import Simulator

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

LATENCY_MS = 300
# Far shorter than the first dataset's backlog (about 40 batches of 300 ms or more).
LEASE_S = "3"
WAIT_S = 240.0


@pytest.fixture
def shared() -> dict[str, str]:
    return small_chunks(extract_batch="1")


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with Simulator(latency_ms=LATENCY_MS, seed=11) as running:
        yield running


def test_a_run_queued_behind_another_run_s_backlog_is_not_interrupted(
    deployment: Deployment, simulator: Simulator, tmp_path: Path
) -> None:
    # Given one worker process for every queue, a short lease and a supervisor looking every second
    cluster = deployment.configured(
        llm_url=simulator.base_url, llm_api_key="test", lease_s=LEASE_S, supervise_every_s="1"
    )
    add_corpus(cluster, write_corpus(tmp_path / "big", documents=8, sentences=12), "big")
    add_corpus(cluster, write_corpus(tmp_path / "small", documents=2, sentences=6), "small")
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(cluster, logs, queues={"all": "pipeline,extract,load"}, concurrency=1)
    workers.start()
    try:
        # When the small dataset is cognified once the big one's extraction is under way, so
        # that its batches queue behind the big one's
        with cognifying(cluster, "big", logs) as (big, big_log):
            with cluster.memory() as memory:
                wait_for_extraction(memory, dataset_id(cluster, "big"), 0.05, big)
            with cognifying(cluster, "small", logs) as (small, small_log):
                codes = (big.wait(timeout=WAIT_S), small.wait(timeout=WAIT_S))
    finally:
        workers.stop()

    # Then both runs complete, once each: waiting in the broker is not being dead
    detail = f"{big_log.read_text()[-2000:]}\n{small_log.read_text()[-2000:]}\n{workers.logs()}"
    with cluster.memory() as memory:
        for name in ("big", "small"):
            of_dataset = dataset_id(cluster, name)
            runs = memory.wiring.metadata.list_runs(of_dataset)
            assert [(run.status, run.error) for run in runs] == [(RunStatus.COMPLETED, "")], detail
            counts = chunk_counts(memory, of_dataset)
            assert 0 < counts[ChunkStatus.LOADED] == sum(counts.values()), counts
    assert codes == (0, 0), detail
