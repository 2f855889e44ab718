"""Agent memory on the workers: `kenning.remember` by task name, and a forget that races a cognify.

One worker consumes every queue; sessions live in the test's Redis (`KENNING_SESSION_BACKEND=redis`),
so what a worker writes to a session, any process reads at once. The client is a bare Celery app,
as another service would have.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from kenning.pipeline.ingest import text_source
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import ChunkStatus, ItemStatus, RunStatus, Scope
from kenning.workers.celery.app import open_lock
from kenning.workers.memory import Kenning
from tests.integration.cluster import Deployment, Workers, kenning_env, running, settings_of
from tests.integration.test_distributed import graph_of, lock_released, vector_ids

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(360)]

TASK_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 180.0
KEEPERS = ["Mara Quill", "Tomas Reed", "Iris Vale", "Ada Hollow", "Jon Pike", "Nell Harrow", "Owen Marsh"]
PLACES = ["Harrow Point", "Gull Beach", "Kew", "Lancaster", "Saltwind Bay"]
TEXTS = 240


@pytest.fixture
def shared() -> dict[str, str]:
    """As the package's fixture, with larger extraction batches: a few hundred texts stay quick."""
    return {"tenant": f"t-{uuid.uuid4().hex[:8]}", "embedding_provider": "hash", "extract_batch": "16"}


@pytest.fixture
def sessions(deployment: Deployment) -> Deployment:
    return deployment.configured(session_backend="redis")


@pytest.fixture
def worker(sessions: Deployment, tmp_path: Path) -> Iterator[Workers]:
    with running(sessions, tmp_path, {"all": "pipeline,extract,load,query"}) as started:
        yield started


class Client:
    """Another service: it sends kenning's tasks by name, with celery alone."""

    def __init__(self, deployment: Deployment) -> None:
        settings = deployment.settings
        self.tenant, self._prefix = settings.tenant, settings.queue_prefix
        self._app = Celery("client", broker=settings.broker_url, backend=settings.result_backend)

    def send(self, name: str, payload: dict[str, Any], kind: str) -> Any:
        return self._app.send_task(
            name, args=[{"tenant": self.tenant, **payload}], queue=f"{self._prefix}.{kind}"
        )

    def call(self, name: str, payload: dict[str, Any], kind: str) -> dict[str, Any]:
        return dict(self.send(name, payload, kind).get(timeout=TASK_TIMEOUT_S))

    def follow(self, run_id: str) -> dict[str, Any]:
        """The run once it has completed or errored (or as it stands after RUN_TIMEOUT_S)."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        run = self.call("kenning.run", {"run_id": run_id}, "pipeline")
        ended = ("completed", "completed_with_errors", "errored")
        while run["status"] not in ended and time.monotonic() < deadline:
            time.sleep(0.5)
            run = self.call("kenning.run", {"run_id": run_id}, "pipeline")
        return run

    def close(self) -> None:
        self._app.close()


@pytest.fixture
def client(sessions: Deployment) -> Iterator[Client]:
    service = Client(sessions)
    try:
        yield service
    finally:
        service.close()


def test_remember_by_task_name_writes_the_session_now_and_the_graph_after_the_run(
    sessions: Deployment, worker: Workers, client: Client
) -> None:
    # Given a conversation of two messages
    messages = [
        {"speaker": "Caroline", "text": "I joined the support group.", "time": "2023-05-08T13:56:00"},
        {"speaker": "Melanie", "text": "My cat Oliver sleeps on the piano.", "id": "m-2"},
    ]

    # When a service sends it to kenning.remember with a session id, for one user
    request = {"dataset": "chat", "session_id": "s1", "user": "agent-7", "messages": messages}
    reply = client.call("kenning.remember", request, "pipeline")

    # Then the entries are in that user's shared session at once, before anyone follows the run
    with Kenning(sessions.configured(user="agent-7").settings) as memory:
        assert memory.wiring.sessions is not None
        entries = memory.wiring.sessions.get_session(memory.session_key("s1"))
    assert [entry.id for entry in entries] == reply["session_entries"], worker.logs()
    assert [(entry.speaker, entry.question, entry.dataset) for entry in entries] == [
        ("Caroline", "I joined the support group.", "chat"),
        ("Melanie", "My cat Oliver sleeps on the piano.", "chat"),
    ]
    assert len(reply["item_ids"]) == 2 and reply["run_id"]

    # And once the run it enqueued completes, the graph finds the messages, speaker and time kept
    assert client.follow(reply["run_id"])["status"] == "completed", worker.logs()
    query = {"query": "Who joined the support group?", "type": "CHUNKS", "datasets": ["chat"]}
    found = client.call("kenning.search", query, "query")["results"]
    assert found[0]["text"] == "[2023-05-08T13:56:00] Caroline: I joined the support group."
    assert {hit["data_id"] for hit in found} == set(reply["item_ids"])

    # And without a session id, remember adds and enqueues the run only
    alone = {"dataset": "notes", "messages": [{"text": "Tomas Reed installed electric light."}]}
    reply = client.call("kenning.remember", alone, "pipeline")
    assert set(reply) == {"item_ids", "run_id"}
    assert client.follow(reply["run_id"])["status"] == "completed", worker.logs()

    # And a request with no messages fails, naming the field
    with pytest.raises(Exception, match="messages"):
        client.call("kenning.remember", {"dataset": "chat", "messages": []}, "pipeline")


def corpus() -> dict[str, str]:
    """Texts by name that share keepers and places: most nodes and edges have several items behind them."""
    return {
        f"text {n}": f"{KEEPERS[n % len(KEEPERS)]} kept the lamp at {PLACES[n % len(PLACES)]} in {1700 + n}. "
        f"Ship number {n} passed {PLACES[(n + 2) % len(PLACES)]} that night."
        for n in range(TEXTS)
    }


def clean_ingest(tmp_path: Path, shared: dict[str, str], texts: dict[str, str], dataset: str) -> Kenning:
    """The same texts cognified by the embedded runner alone, in a home of its own."""
    memory = Kenning(settings_of(kenning_env(**shared, home=str(tmp_path / "clean"))))
    memory.add([text_source(text, name) for name, text in texts.items()], dataset)
    assert memory.cognify(dataset).status == RunStatus.COMPLETED
    return memory


def lock_taken(deployment: Deployment, dataset: str) -> bool:
    """Wait (bounded) until some run holds the dataset lock; False if none took it in time."""
    settings = deployment.settings
    client = redis.Redis.from_url(settings.redis_url)
    name = lock_name(Scope(tenant=settings.tenant, dataset=dataset))
    deadline = time.monotonic() + TASK_TIMEOUT_S
    try:
        lock = open_lock(client, settings)
        while lock.holder(name) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True
    finally:
        client.close()


@pytest.mark.parametrize("forget_sent", ["at once", "once the run holds the lock"])
def test_forget_racing_a_cognify_of_its_dataset_ends_as_one_after_the_other(
    sessions: Deployment,
    worker: Workers,
    client: Client,
    tmp_path: Path,
    shared: dict[str, str],
    forget_sent: str,
) -> None:
    # Given a dataset of a few hundred texts, not cognified yet
    texts = corpus()
    with Kenning(sessions.settings) as memory:
        added = memory.add([text_source(text, name) for name, text in texts.items()], "race").added
    assert len(added) == TEXTS
    gone = [item.id for item in added if int(item.name.split()[1]) % 3 == 0]
    kept = {name: text for name, text in texts.items() if int(name.split()[1]) % 3}

    # When a cognify of it is sent, and a forget of a third of its items: at once (the forget
    # is one message away from the lock, the run two, so it mostly wins), or once the run has it
    cognify = client.send("kenning.cognify", {"dataset": "race"}, "pipeline")
    if forget_sent != "at once":
        assert lock_taken(sessions, "race"), worker.logs()
    forget = client.send("kenning.forget", {"dataset": "race", "data_ids": gone}, "load")
    run = client.follow(dict(cognify.get(timeout=TASK_TIMEOUT_S))["run_id"])
    forgotten = dict(forget.get(timeout=RUN_TIMEOUT_S))

    # Then both ended well, and the dataset lock is free
    assert run["status"] == "completed" and not run["error"], worker.logs()
    assert sorted(forgotten["items"]) == sorted(gone)
    assert lock_released(sessions, "race")

    # And the lock put them one after the other: either the forget went first and the run never
    # saw the forgotten items, or the run saw every item and the forget then took their part out
    # of the graph; nothing in between
    forget_first = run["stats"]["documents"] == len(kept)
    if forget_first:
        assert forgotten["nodes"] == forgotten["edges"] == forgotten["chunks"] == 0
    else:
        assert run["stats"]["documents"] == TEXTS
        assert forgotten["chunks"] == len(gone) and forgotten["nodes"] > 0
    if forget_sent != "at once":
        assert not forget_first

    # And either way the memory is what a clean ingest of the remaining texts makes
    with Kenning(sessions.settings) as memory:
        dataset = memory.wiring.metadata.get_dataset(memory.scope("race"))
        assert dataset is not None
        items = memory.wiring.metadata.list_items(dataset.id)
        chunks = {status: memory.wiring.chunks.list_chunk_ids(dataset.id, status) for status in ChunkStatus}
        raced = graph_of(memory, "race")
    assert sorted(item.name for item in items) == sorted(kept)
    assert {item.status for item in items} == {ItemStatus.DONE}
    assert {status for status, ids in chunks.items() if ids} == {ChunkStatus.LOADED}
    assert len(chunks[ChunkStatus.LOADED]) == len(kept)
    clean = clean_ingest(tmp_path, shared, kept, "race")
    try:
        assert raced == graph_of(clean, "race")
    finally:
        clean.close()
    worker.stop()
    assert vector_ids(sessions.settings) == vector_ids(clean.settings)
