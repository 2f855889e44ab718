"""A task paused past its lease, whose dataset lock another run then took, writes nothing more."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import ChunkStatus, Dataset, RunStatus, Scope
from kenning.storage.coordination.run_lock import RedisRunLock
from kenning.workers.runtime import keys
from tests.integration.cluster import CLI_TIMEOUT_S, ROOT, Deployment, Workers
from tests.simulator import Simulator

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

LOCK_TTL_S = 2
LATENCY_MS = 4000
WAIT_S = 60.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def take_once_expired(lock: RedisRunLock, name: str) -> int | None:
    """The token another run takes the lock under once its holder's hold has expired (polled, bounded)."""
    deadline = time.monotonic() + WAIT_S
    while (token := lock.take(name, "another-run", 600)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return token


def test_a_paused_holder_past_its_lease_has_its_writes_refused(
    deployment: Deployment, tmp_path: Path
) -> None:
    with Simulator(latency_ms=LATENCY_MS) as simulator:
        # Given one worker, a slow LLM and a short lock ttl
        fenced = deployment.configured(
            llm_url=simulator.base_url, llm_api_key="test", lock_ttl_s=str(LOCK_TTL_S)
        )
        scope = Scope(tenant=fenced.settings.tenant, dataset="fenced")
        with fenced.memory() as memory:
            memory.add_text("Lise Meitner explained nuclear fission with Otto Frisch.", "fenced")
        workers = Workers(fenced, tmp_path, {"all": "pipeline,extract,load"}, concurrency=1)
        workers.start()
        client = redis.Redis.from_url(fenced.settings.redis_url)
        try:
            follower = subprocess.Popen(
                fenced.cognify_command("fenced"),
                cwd=ROOT,
                env=fenced.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            # When the worker is stopped while its extraction call is in flight
            wait_until(lambda: simulator.stats()["calls"]["chat"] >= 1, "the extraction call")
            workers.pause("all")
            # ... past its lease, and another run takes the expired lock
            lock = RedisRunLock(client, prefix=keys.lock_prefix(fenced.settings.queue_prefix))
            name = lock_name(scope)
            intruder = take_once_expired(lock, name)
            assert intruder is not None
            # ... and then resumes, its answer from the LLM waiting for it
            workers.resume("all")
            follower.wait(timeout=CLI_TIMEOUT_S)
        finally:
            workers.stop()
        logs = workers.logs()

        with fenced.memory() as memory:
            [run] = memory.wiring.metadata.list_runs(Dataset.of(scope).id)
            chunks = memory.wiring.chunks
            statuses = {c.status for c in chunks.get_chunks(chunks.list_chunk_ids(run.dataset_id))}
        # Then nothing of the extraction was written: the chunk is still pending
        assert statuses == {ChunkStatus.PENDING}, logs
        # And its run ended errored, refused at the fence
        assert run.status == RunStatus.ERRORED, logs
        assert "LockLost" in run.error and "no longer held under token" in run.error, run.error
        # And the other run still holds the lock
        assert lock.holder(name) == intruder
        client.close()
