"""One mode, one runner, one lock: a run started over HTTP is the run Python starts (same metrics),
it can be cancelled between batches and retried for what is left, and in distributed mode every
surface holds the very Redis run lock the Celery tasks hold."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from kenning.pipeline.ingest import Source, text_source
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import EMBEDDED, ChunkStatus, RunStatus, Scope
from kenning.pipeline.permission import User, issue_key
from kenning.storage.coordination.run_lock import RedisRunLock
from kenning.workers.api import create_app
from kenning.workers.celery.app import open_lock
from kenning.workers.memory import Kenning
from kenning.workers.runtime.metrics import metrics
from kenning.workers.runtime.settings import in_mode, load_settings
from kenning.workers.runtime.wiring import Wiring
from tests.integration.cluster import Deployment, Workers
from tests.integration.test_memory_distributed import Client, corpus, lock_taken
from tests.services import REDIS_URL
from tests.simulator import JSON, Simulator, _Reply

WAIT_S = 30.0
FAMILIES = ("kenning_runs_total", "kenning_step_seconds_count", "kenning_run_counts_total")


def key_for(memory: Kenning) -> dict[str, str]:
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name="ada", admin=True)
    store.add_user(user)
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def run_samples() -> dict[str, float]:
    """The samples of the run and step families, by line head (name and labels)."""
    found = {}
    for line in metrics().exposition().decode().splitlines():
        head, _, value = line.rpartition(" ")
        if head.startswith(FAMILIES):
            found[head] = float(value)
    return found


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {head: value - before.get(head, 0.0) for head, value in after.items() if value != before.get(head)}


def ended(client: TestClient, auth: dict[str, str], run_id: str, field: str = "status") -> dict[str, Any]:
    """The run once it has ended (polled, at most `WAIT_S`); with `field` "finished_at", once its
    process has let go of it too."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        run: dict[str, Any] = client.get(f"/v1/runs/{run_id}", headers=auth).json()
        if run[field] and run[field] not in ("initiated", "started"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not end within {WAIT_S} s")


def test_a_run_started_over_http_moves_the_metrics_a_python_run_moves(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    with Kenning(settings) as memory, TestClient(create_app(memory)) as client:
        auth = key_for(memory)
        for dataset, place in (("python", "Harrow Point"), ("http", "Sable Point")):
            texts = [f"Keeper number {n} lit the lamp at {place}." for n in range(3)]
            memory.add(sources(*texts), dataset)
        # Given documents of one shape in two datasets, when one is cognified from Python
        before = run_samples()
        assert memory.cognify("python").status == RunStatus.COMPLETED
        by_python = moved(before, run_samples())
        # And the other over HTTP
        before = run_samples()
        answer = client.post("/v1/cognify?wait=true", headers=auth, json={"dataset": "http"})
        assert answer.status_code == 200 and answer.json()["status"] == "completed", answer.text
        by_http = moved(before, run_samples())
    # Then both moved the same run, step and counter samples by the same amounts
    assert by_python['kenning_runs_total{status="completed"}'] == 1
    assert by_python['kenning_step_seconds_count{step="extract"}'] == 1
    assert by_http == by_python


def sources(*texts: str) -> list[Source]:
    return [text_source(text, name=f"doc-{n}.txt") for n, text in enumerate(texts)]


class GatedSimulator(Simulator):
    """The LLM simulator, holding every chat request from the `hold_from`-th on until `gate` is
    set; `holding` is set when the first one is held."""

    def __init__(self, hold_from: int) -> None:
        super().__init__()
        self.hold_from = hold_from
        self.gate, self.holding = threading.Event(), threading.Event()
        self.chats = 0
        self._count = threading.Lock()

    def chat_reply(self, body: JSON) -> _Reply:
        with self._count:
            self.chats += 1
            held = self.chats >= self.hold_from
        if held:
            self.holding.set()
            self.gate.wait(WAIT_S)
        return super().chat_reply(body)


@pytest.fixture
def simulator() -> Iterator[GatedSimulator]:
    gated = GatedSimulator(hold_from=3)
    gated.start()
    try:
        yield gated
    finally:
        gated.gate.set()
        gated.stop()


def test_an_embedded_run_cancelled_over_http_stops_and_its_retry_does_only_the_rest(
    tmp_path: Path, simulator: GatedSimulator
) -> None:
    # Given one chunk per LLM call, one call at a time, and eight documents of one chunk each
    settings = load_settings(
        home=tmp_path / "home",
        embedding_provider="hash",
        llm_url=simulator.base_url,
        concurrency=1,
        extract_batch=1,
        extraction_unit_tokens=0,
    )
    texts = [f"Keeper {name} lit the lamp at Harrow Point in winter." for name in "ABCDEFGH"]
    with Kenning(settings) as memory, TestClient(create_app(memory)) as client:
        auth = key_for(memory)
        memory.add(sources(*texts), "notes")
        dataset = memory.dataset("notes")
        # When a run started over HTTP has its third extraction in flight
        run_id = client.post("/v1/cognify", headers=auth, json={"dataset": "notes"}).json()["id"]
        assert simulator.holding.wait(WAIT_S)
        run = memory.wiring.metadata.get_run(run_id)
        assert run is not None and run.mode == EMBEDDED
        # And it is cancelled over HTTP, then that extraction is answered
        cancelled = client.post(f"/v1/runs/{run_id}/cancel", headers=auth, json={"reason": "wrong corpus"})
        assert cancelled.status_code == 200, cancelled.text
        # Then it reads cancelled, but not finished while its process still has a batch in flight
        stopping = client.get(f"/v1/runs/{run_id}", headers=auth).json()
        assert stopping["status"] == "cancelled" and stopping["finished_at"] is None, stopping
        simulator.gate.set()
        # And it finishes, having sent no extraction after the one in flight, which it recorded
        stopped = ended(client, auth, run_id, "finished_at")
        assert stopped["status"] == "cancelled" and "wrong corpus" in stopped["error"]
        chunks = memory.wiring.chunks
        pending = chunks.list_chunk_ids(dataset.id, ChunkStatus.PENDING)
        assert simulator.chats == 3 and len(pending) == len(texts) - 3
        # And its dataset lock is free: a retry starts, and extracts only the chunks left
        retried = client.post(f"/v1/runs/{run_id}/retry", headers=auth)
        assert retried.status_code == 202, retried.text
        again = ended(client, auth, retried.json()["id"])
        assert again["status"] == "completed", again
        assert simulator.chats == len(texts)
        assert chunks.list_chunk_ids(dataset.id, ChunkStatus.PENDING) == []


@pytest.fixture
def distributed(tmp_path: Path) -> Iterator[Kenning]:
    """A memory in distributed mode (as `serve --distributed` makes it) whose Redis keys are its own."""
    settings = load_settings(
        home=tmp_path / "home",
        embedding_provider="hash",
        redis_url=REDIS_URL,
        queue_prefix=f"kenning-test-{uuid.uuid4().hex[:8]}",
    )
    with Kenning(settings, Wiring(settings, distributed=True)) as memory:
        yield memory
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{settings.queue_prefix}:*"):
        client.delete(key)
    client.close()


@pytest.mark.redis
def test_forget_waits_for_the_redis_run_lock_a_celery_run_holds(
    distributed: Kenning, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = distributed
    # The dataset is built in this process (a distributed memory's cognify goes to the workers)
    with Kenning(in_mode(memory.settings, "embedded")) as builder:
        builder.add(sources("Keeper Ada lit the lamp at Harrow Point."), "notes")
        assert builder.cognify("notes").status == RunStatus.COMPLETED
    scope = Scope(tenant=memory.settings.tenant, dataset="notes")
    # Given the dataset's lock held the way a Celery run holds it: the same lock, by run id
    client = redis.Redis.from_url(REDIS_URL)
    celery_lock = open_lock(client, memory.settings)
    assert celery_lock.take(lock_name(scope), "celery-run", 60) is not None
    refused = threading.Event()
    take = RedisRunLock.take

    def watched(lock: RedisRunLock, name: str, run_id: str, ttl_s: float) -> int | None:
        token = take(lock, name, run_id, ttl_s)
        if token is None and run_id != "celery-run":
            refused.set()
        return token

    monkeypatch.setattr(RedisRunLock, "take", watched)
    # When the dataset is forgotten meanwhile
    forgetting = threading.Thread(target=memory.forget, args=("notes",))
    forgetting.start()
    try:
        # Then the forget is refused the lock and waits, the dataset still there
        assert refused.wait(WAIT_S)
        assert forgetting.is_alive()
        assert [d.name for d in memory.wiring.metadata.list_datasets(scope.tenant)] == ["notes"]
    finally:
        # And once the run lets go, the forget does its work
        celery_lock.release_run(lock_name(scope), "celery-run")
        forgetting.join(WAIT_S)
        client.close()
    assert not forgetting.is_alive()
    assert memory.wiring.metadata.list_datasets(scope.tenant) == []


@pytest.fixture
def cluster(deployment: Deployment, tmp_path: Path) -> Iterator[tuple[Workers, Client]]:
    """One Celery worker on every queue, and a service that sends it tasks by name."""
    running, service = Workers(deployment, tmp_path, {"all": "pipeline,extract,load"}), Client(deployment)
    try:
        running.start()
        yield running, service
    finally:
        service.close()
        running.stop()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.timeout(360)
def test_a_forget_in_distributed_mode_waits_for_a_celery_cognify_of_its_dataset(
    deployment: Deployment, cluster: tuple[Workers, Client]
) -> None:
    sessions, (worker, client) = deployment, cluster
    # Given a dataset of a few hundred texts, and a cognify of it on the workers holding its lock
    texts = corpus()
    with Kenning(sessions.settings) as memory:
        added = memory.add([text_source(text, name) for name, text in texts.items()], "race").added
    gone = [item.id for item in added if int(item.name.split()[1]) % 3 == 0]
    run_id = dict(client.send("kenning.cognify", {"dataset": "race"}, "pipeline").get(timeout=60))["run_id"]
    assert lock_taken(sessions, "race"), worker.logs()
    # When a third of its items is forgotten from Python, as `serve --distributed` wires it
    settings = sessions.settings
    with Kenning(settings, Wiring(settings, distributed=True)) as memory:
        [forgotten] = memory.forget("race", gone)
        run = memory.wiring.metadata.get_run(run_id)
    # Then the forget waited for the run to end, and took the forgotten items' part out after it
    assert run is not None and run.status == RunStatus.COMPLETED, worker.logs()
    assert run.stats["documents"] == len(texts)
    assert forgotten.chunks == len(gone) and forgotten.nodes > 0


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.timeout(360)
def test_a_python_cognify_in_distributed_mode_runs_on_the_workers(
    deployment: Deployment, cluster: tuple[Workers, Client]
) -> None:
    worker, _client = cluster
    # Given a program of the deployment (its own process: the Celery app serves one configuration
    # a process) that adds a text and cognifies it from Python, in distributed mode
    program = (
        "import json\n"
        "from kenning.pipeline.ingest import text_source\n"
        "from kenning.workers.memory import Kenning\n"
        "from kenning.workers.runtime.settings import in_mode, load_settings\n"
        "with Kenning(in_mode(load_settings(), 'distributed')) as memory:\n"
        "    memory.add([text_source('Ada Lovelace wrote the first program.', 'ada')], 'py')\n"
        "    run = memory.cognify('py')\n"
        "print(json.dumps({'status': run.status.value, 'mode': run.mode, 'stats': run.stats}))\n"
    )
    # When it runs
    done = subprocess.run(
        [sys.executable, "-c", program], env=deployment.env, capture_output=True, text=True, timeout=300
    )
    # Then the run was the workers': recorded as distributed, completed, with the item done
    assert done.returncode == 0, done.stderr[-3000:] + worker.logs()
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["status"] == "completed", worker.logs()
    assert run["mode"] == "distributed" and run["stats"]["documents"] == 1
