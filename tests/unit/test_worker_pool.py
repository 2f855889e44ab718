"""What pool `kenning worker` runs each kind of worker in, and how many tasks at once by default."""

from __future__ import annotations

from kenning.workers.celery.app import worker_pool, worker_queues
from kenning.workers.runtime.settings import load_settings


def pool_of(queues: str, **settings: object) -> tuple[str, int]:
    configured = load_settings(**settings)
    return worker_pool(configured, worker_queues(configured, queues))


def test_an_extract_worker_runs_threads_enough_to_fill_its_call_slots_twice() -> None:
    # 32 calls in flight at most, 8 units a batch: 4 batches fill them, 8 tasks keep the next at hand
    assert pool_of("extract") == ("threads", 8)
    assert pool_of("pipeline,extract", concurrency=64, extract_batch=4) == ("threads", 32)
    assert pool_of("extract,load") == ("threads", 8)


def test_a_load_worker_shares_qdrant_edge_on_threads_and_scales_in_processes_with_a_server() -> None:
    assert pool_of("load") == ("threads", 2)
    assert pool_of("load", qdrant_url="http://127.0.0.1:6333") == ("prefork", 2)
    assert pool_of("pipeline") == ("prefork", 2)
