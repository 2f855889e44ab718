"""An extraction task keeps several LLM calls in flight, every call is still paid for once, and
each batch's chunks are loaded as soon as it ends.

One `kenning worker` consuming every queue, one task at a time, four extraction units to a
batch, the LLM simulator answering after a delay: the units of a batch go out together, under
the worker's call slots, and a load part follows each batch. Every unit is extracted exactly
once (the simulator's count), every chunk is loaded by the parts, the spend ledger shows every
call, and the memory is the one an embedded run builds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kenning.pipeline.models import ChunkStatus
from tests.integration.cluster import ROOT, Deployment, Workers, small_chunks
from tests.integration.faults import chunk_counts, dataset_id
from tests.integration.test_chaos import add_corpus, assert_same_as_embedded, write_corpus
from tests.integration.test_spend import STATUS, assert_spend, status_of
from tests.simulator import Simulator

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

LATENCY_MS = 300


@pytest.fixture
def shared() -> dict[str, str]:
    return small_chunks(extract_batch="4")


def test_one_extract_task_keeps_its_batch_of_calls_in_flight_and_its_chunks_load_as_it_ends(
    deployment: Deployment, tmp_path: Path, shared: dict[str, str]
) -> None:
    corpus = write_corpus(tmp_path / "corpus", documents=4, sentences=8)
    with Simulator(latency_ms=LATENCY_MS, seed=3) as simulator:
        # Given one worker that runs one task at a time
        target = deployment.configured(llm_url=simulator.base_url, llm_api_key="test")
        add_corpus(target, corpus, "paced")
        logs = tmp_path / "logs"
        logs.mkdir()
        workers = Workers(target, logs, queues={"all": "pipeline,extract,load"}, concurrency=1)
        workers.start()
        try:
            # When the dataset is cognified
            done = target.cognify("paced")
        finally:
            workers.stop()
        billed = simulator.stats()
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{workers.logs()}"
    # Then the calls of one batch were answered together
    assert billed["max_in_flight"] > 1, billed
    # And every chunk is loaded, each unit paid for once, every call in the ledger
    with target.memory() as memory:
        counts = chunk_counts(memory, dataset_id(target, "paced"))
        run = memory.wiring.metadata.list_runs(dataset_id(target, "paced"))[0]
    assert counts[ChunkStatus.LOADED] == sum(counts.values()) > 0, counts
    # And the load parts that followed the batches loaded them all, none was left to the load step
    assert run.stats.get("streamed_chunks") == counts[ChunkStatus.LOADED], run.stats
    assert billed["calls"]["chat"] == run.stats["llm_calls"], (billed["calls"], run.stats)
    assert_spend(status_of(target.env, "paced"), billed)
    # And status says where load workers may run: the vectors are Qdrant Edge on this machine's disk
    env = {**target.env, "KENNING_MODE": "distributed"}
    shown = subprocess.run(
        [*STATUS, "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["load"]["load_workers"].startswith("only on this machine"), shown.stdout
    assert_same_as_embedded(target, tmp_path, shared, corpus, "paced")
