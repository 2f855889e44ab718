"""What pool `kenning worker` runs each kind of worker in, and how many tasks at once by default."""

from __future__ import annotations

from typing import Any

from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import Scope
from kenning.pipeline.plan import STEPS, start_run
from kenning.workers.celery.app import WARM_PORTS, warm_ports, worker_pool, worker_queues
from kenning.workers.runtime.settings import load_settings
from tests.twins import TwinServices


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


class Recording:
    """Services that note which of them the code asks for."""

    def __init__(self, inner: TwinServices) -> None:
        self._inner = inner
        self.used: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.used.add(name)
        return getattr(self._inner, name)


def test_a_worker_makes_at_start_every_port_its_queues_tasks_use() -> None:
    # Given a dataset, and services that note which ports each step's tasks use
    services = Recording(TwinServices())
    scope = Scope(tenant="t1", dataset="warm")
    source = Source(name="a.txt", uri="t:a", data=b"Ana lives in Oslo.")
    add(services.metadata, services.blobs, scope, [source])
    job = start_run(services, scope)  # type: ignore[arg-type]
    ports = {port for names in WARM_PORTS.values() for port in names}
    units: list[Any] = []
    for kind, steps in (("pipeline", ("classify", "chunk")), ("extract", ("extract",)), ("load", ("load",))):
        services.used.clear()
        # When the queue's steps run
        for step in steps:
            units = STEPS[step].run(services, job, units).items or units  # type: ignore[arg-type]
        # Then its worker made each port they used as it started (the first task makes none)
        assert services.used & ports <= set(warm_ports([kind])), kind
