"""On the workers, the counts the `--distributed` follower draws move during each step.

The follower draws a run's chunks extracted and chunks loaded from the chunk statuses in the
metadata store (`canvas.chunk_counts`, `canvas.draw`). Each extract batch and each load batch
marks its own chunks, so the counts climb batch by batch, not from none to all at the step's
end. Every call to the simulated LLM and embedding endpoint takes its latency, so a batch takes
at least that long and the test's polls, much more frequent, see the counts in between.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kenning.pipeline.context import Job
from kenning.pipeline.models import ENDED, ChunkStatus, RunStatus
from kenning.workers.celery.canvas import chunk_counts, current_run
from tests.integration.cluster import Deployment, Workers, small_chunks
from tests.integration.faults import cognifying, dataset_id
from tests.integration.test_chaos import add_corpus, write_corpus
from tests.simulator import Simulator

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

LATENCY_MS = 400
POLL_S = 0.05
WAIT_S = 180.0


@pytest.fixture
def shared() -> dict[str, str]:
    return small_chunks(load_batch="4")


def test_the_follower_s_counts_climb_batch_by_batch_in_extract_and_load(
    deployment: Deployment, tmp_path: Path
) -> None:
    # Given two workers, an LLM and an embedding endpoint that each take 400 ms a call
    with Simulator(latency_ms=LATENCY_MS) as simulator:
        cluster = deployment.configured(
            llm_url=simulator.base_url,
            llm_api_key="test",
            embedding_provider="openai",
            embedding_url=simulator.base_url,
        )
        add_corpus(cluster, write_corpus(tmp_path / "corpus", documents=3, sentences=12), "bars")
        logs = tmp_path / "logs"
        logs.mkdir()
        workers = Workers(cluster, logs)
        workers.start()
        try:
            # When the dataset is cognified and its counts are read as the follower reads them
            seen = follow_counts(cluster, logs)
        finally:
            workers.stop()

    # Then the run completed, and both counts were seen part way, between none and all
    status, total, extracted, loaded = seen
    assert status == RunStatus.COMPLETED, workers.logs()
    assert total > 8
    assert any(0 < value < total for value in extracted), extracted
    assert any(0 < value < total for value in loaded), loaded
    assert loaded[-1] == total


def follow_counts(cluster: Deployment, logs: Path) -> tuple[RunStatus, int, list[int], list[int]]:
    """The run's status at its end, its chunks, and the chunks extracted and loaded at each poll."""
    extracted: list[int] = []
    loaded: list[int] = []
    of_dataset = dataset_id(cluster, "bars")
    with cognifying(cluster, "bars", logs) as (follower, _), cluster.memory() as memory:
        deadline = time.monotonic() + WAIT_S
        job = None
        while time.monotonic() < deadline:
            runs = memory.wiring.metadata.list_runs(of_dataset)
            if job is None and runs:
                tenant = cluster.settings.tenant
                job = Job(run_id=runs[0].id, dataset_id=of_dataset, tenant=tenant, dataset="bars")
            if job is not None:
                counts = chunk_counts(memory.wiring, job)
                extracted.append(counts[ChunkStatus.EXTRACTED] + counts[ChunkStatus.LOADED])
                loaded.append(counts[ChunkStatus.LOADED])
                run = current_run(memory.wiring, job)
                if run.status in ENDED:
                    follower.wait(timeout=WAIT_S)
                    return run.status, sum(counts.values()), extracted, loaded
            time.sleep(POLL_S)
    pytest.fail(f"the run did not end within {WAIT_S:.0f} s")
