"""Fixtures of the integration tests: a distributed deployment and its workers, LLM simulators."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import (
    Deployment,
    RedisServer,
    Workers,
    forget_keys,
    kenning_env,
    running,
    settings_of,
)
from tests.integration.test_memory_distributed import Client
from tests.services import free_port
from tests.simulator import Simulator, StartSimulator


@pytest.fixture
def shared() -> dict[str, str]:
    """Settings the distributed and the embedded configuration have in common."""
    return {"tenant": f"t-{uuid.uuid4().hex[:8]}", "embedding_provider": "hash", "extract_batch": "2"}


@pytest.fixture
def deployment(
    tmp_path: Path, postgres_url: str, redis_url: str, shared: dict[str, str]
) -> Iterator[Deployment]:
    prefix = f"kenning-test-{uuid.uuid4().hex[:8]}"
    env = kenning_env(
        **shared,
        home=str(tmp_path / "distributed"),
        metadata_url=postgres_url,
        graph_backend="sql",
        broker_url=redis_url,
        result_backend=redis_url,
        redis_url=redis_url,
        queue_prefix=prefix,
    )
    yield Deployment(env=env, settings=settings_of(env))
    forget_keys(redis_url, prefix)


@pytest.fixture
def workers(deployment: Deployment, tmp_path: Path) -> Iterator[Workers]:
    with running(deployment, tmp_path) as started:
        yield started


@pytest.fixture
def worker(deployment: Deployment, tmp_path: Path) -> Iterator[Workers]:
    """One worker that consumes every queue."""
    with running(deployment, tmp_path, {"all": "pipeline,extract,load,query"}) as started:
        yield started


@pytest.fixture
def client(deployment: Deployment) -> Iterator[Client]:
    """A client of the deployment's service (enqueue, wait, read)."""
    service = Client(deployment)
    try:
        yield service
    finally:
        service.close()


@pytest.fixture
def start_simulator() -> Iterator[StartSimulator]:
    """Starts simulators with the options given; stops them all when the test ends."""
    started: list[Simulator] = []

    def start(**options: Any) -> Simulator:
        simulator = Simulator(**options)
        simulator.start()
        started.append(simulator)
        return simulator

    yield start
    for simulator in started:
        simulator.stop()


@pytest.fixture
def start_workers(tmp_path: Path) -> Iterator[Callable[[Deployment], Workers]]:
    """Start the two usual workers of a deployment; every worker started is stopped at the end."""
    started: list[Workers] = []

    def start(deployment: Deployment) -> Workers:
        logs = tmp_path / f"logs-{len(started)}"
        logs.mkdir()
        workers = Workers(deployment, logs)
        started.append(workers)
        workers.start()
        return workers

    try:
        yield start
    finally:
        for workers in started:
            workers.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, never the machine's: its own port, folder and append-only file."""
    server = RedisServer(tmp_path / "redis", free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
