"""Operations over HTTP: `/ready` probes each store and reports the LLM breaker, `/metrics` counts
requests per route, searches per type and runs per step; a worker's metrics port and the depths
of the Celery queues on Redis."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from celery.signals import task_failure, task_postrun, task_prerun
from fastapi.testclient import TestClient

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.permission import User, issue_key
from kenning.storage.coordination.queue_depth import queue_depths
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.metrics import metrics, serve_worker_metrics
from kenning.workers.runtime.settings import load_settings
from tests.services import REDIS_URL, free_port


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        yield memory


def key_for(memory: Kenning) -> dict[str, str]:
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name="ada", admin=True)
    store.add_user(user)
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def sample(exposition: str, name: str, **labels: str) -> float:
    """The value of one sample of a scrape, 0 when absent."""
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    for line in exposition.splitlines():
        head, _, value = line.rpartition(" ")
        if head == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    return 0.0


def test_ready_reports_each_store_and_the_llm_breaker(memory: Kenning) -> None:
    with TestClient(create_app(memory)) as client:
        # When the stores answer, then it is ready, with no LLM endpoint to report on
        answer = client.get("/ready")
    assert answer.status_code == 200
    assert answer.json() == {
        "status": "ready",
        "stores": {"metadata": "ok", "graph": "ok", "vectors": "ok"},
        "llm_breaker": None,
    }


def test_ready_is_503_when_a_store_is_down_and_names_it(tmp_path: Path) -> None:
    # Given a graph store on a port where nothing listens, and an LLM endpoint
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = load_settings(
        home=tmp_path / "home",
        embedding_provider="hash",
        graph_backend="falkordb",
        graph_url=f"redis://127.0.0.1:{port}",
        llm_url="http://127.0.0.1:9/v1",
    )
    with Kenning(settings) as memory, TestClient(create_app(memory)) as client:
        # When readiness is asked
        answer = client.get("/ready")
        scraped = client.get("/metrics").text
    # Then it is 503, the graph is named as down, the others answer, and the breaker is closed
    assert answer.status_code == 503
    body = answer.json()
    assert body["status"] == "not_ready" and body["llm_breaker"] == "closed"
    assert body["stores"]["metadata"] == body["stores"]["vectors"] == "ok"
    assert body["stores"]["graph"].startswith("unreachable")
    # And the scrape has the LLM client's counters, none spent yet, and the breaker's state
    for purpose in ("extraction", "completion"):
        assert f'kenning_llm_calls_total{{purpose="{purpose}"}} 0.0' in scraped
        assert f'kenning_llm_rate_limited_total{{purpose="{purpose}"}} 0.0' in scraped
    assert sample(scraped, "kenning_llm_breaker", state="closed") == 1


def test_metrics_count_requests_searches_and_runs(memory: Kenning) -> None:
    auth = key_for(memory)
    with TestClient(create_app(memory)) as client:
        before = client.get("/metrics").text
        # Given a remembered fact (one cognify run), when it is searched twice over HTTP
        remembered = client.post("/v1/remember", headers=auth, json={"data": "Ada wrote the first program."})
        assert remembered.status_code == 200
        for _ in range(2):
            query = {"query": "first program", "type": "CHUNKS_LEXICAL", "only_context": True}
            assert client.post("/v1/search", headers=auth, json=query).status_code == 200
        after = client.get("/metrics")
    # Then the scrape counts both searches by type and by route, the run and its steps
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text

    def grew(name: str, **labels: str) -> float:
        return sample(text, name, **labels) - sample(before, name, **labels)

    assert grew("kenning_search_seconds_count", type="CHUNKS_LEXICAL") == 2
    assert grew("kenning_http_request_seconds_count", method="POST", route="/v1/search", status="200") == 2
    assert grew("kenning_runs_total", status="completed") == 1
    assert grew("kenning_run_counts_total", counter="chunks_to_extract") == 1
    assert grew("kenning_step_seconds_count", step="extract") == 1
    assert grew("kenning_run_counts_total", counter="embedded_pid") == 0


@dataclass(frozen=True)
class Task:
    """What the metrics read of a Celery task: its name."""

    name: str


def test_a_worker_serves_metrics_on_the_first_free_port() -> None:
    # Given the worker's port taken (another pool process of the same worker)
    with socket.socket() as taken:
        taken.bind(("", 0))
        port = taken.getsockname()[1]
        taken.listen()
        # When a worker process starts its metrics server there
        served = serve_worker_metrics(port, tries=20)
    # Then it answers scrapes on a port after it
    assert served is not None and port < served < port + 20
    assert "kenning_task_seconds" in httpx.get(f"http://127.0.0.1:{served}/metrics").text

    # And when a task runs and succeeds, and another fails, each is timed with its outcome
    task = Task(name="kenning.extract")
    for task_id, fails in (("t1", False), ("t2", True)):
        task_prerun.send(sender=task, task_id=task_id, task=task)
        if fails:
            task_failure.send(sender=task, task_id=task_id, exception=RuntimeError("x"))
        task_postrun.send(sender=task, task_id=task_id, task=task)
    scraped = httpx.get(f"http://127.0.0.1:{served}/metrics").text
    for outcome in ("succeeded", "failed"):
        assert sample(scraped, "kenning_task_seconds_count", outcome=outcome, task="kenning.extract") >= 1


def test_queue_depths_count_every_priority_and_reach_the_scrape() -> None:
    # Given two queues on Redis, one with tasks at two priorities, the other empty
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"kenning-test-{uuid.uuid4().hex[:8]}"
    busy, idle = f"{prefix}.extract", f"{prefix}.load"
    client.rpush(busy, "a", "b")
    client.rpush(busy + "\x06\x166", "c")
    try:
        # When their depths are read, and scraped through a worker's metrics
        assert queue_depths(client, [busy, idle]) == {busy: 3, idle: 0}
        metrics().watch_queues(lambda: queue_depths(client, [busy, idle]))
        scraped = metrics().exposition().decode()
    finally:
        client.delete(busy, busy + "\x06\x166")
    # Then the scrape has both
    assert sample(scraped, "kenning_queue_depth", queue=busy) == 3
    assert f'kenning_queue_depth{{queue="{idle}"}} 0.0' in scraped


def test_queue_depths_translate_a_broker_that_is_down() -> None:
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(TransientStoreError):
        queue_depths(client, ["kenning.extract"])
