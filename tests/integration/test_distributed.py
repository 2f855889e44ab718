"""Cognify on two Celery worker processes (real Redis and PostgreSQL), checked against the embedded runner.

Worker A consumes the pipeline and extract queues, worker B the extract and load queues:
B alone opens the embedded vector store. Every test has its own queue prefix (hence its own
queues and lock keys) and its own tenant, so parallel runs never share work.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
from qdrant_client import QdrantClient

from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import ItemStatus, PipelineRun, RunStatus, Scope
from kenning.storage.vectors.edge import EdgeVectorStore
from kenning.workers.celery.app import open_lock
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings
from tests.integration.cluster import CLI_TIMEOUT_S, ROOT, Deployment, Workers, kenning_env, settings_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

MAX_POINTS = 10_000

DOCUMENTS = {
    "ada.txt": "Ada Lovelace wrote the first published algorithm. She worked with Charles Babbage.",
    "babbage.txt": "Charles Babbage designed the Analytical Engine in London. It was never built.",
    "harbor.md": "# Harrow Point\n\nThe Harrow Point lighthouse guards the harbor. Mara Quill kept the lamp.",
    "guild.txt": "Mara Quill founded the Lighthouse Keepers Guild in Harrow Point. It trained keepers.",
    "wreck.txt": "The ship Saltwind ran aground near Harrow Point. Its cargo of tea washed up on Gull Beach.",
    "lamp.txt": "The Harrow Point lamp burned whale oil, then kerosene. Tomas Reed installed electric light.",
    "river.txt": "The river Lune flows through Lancaster. Lancaster Castle stands above the river Lune.",
    "garden.txt": "Iris Vale planted the Winter Garden in Kew. The Winter Garden holds ferns from Chile.",
}
TABLES = {
    "customers.csv": "id,name,city\n1,Acme Tools,London\n2,Globex,Lancaster\n3,Initech,Kew\n",
    "orders.csv": "id,customer_id,total\n10,1,250\n11,2,75\n12,1,30\n13,3,120\n",
}
EMPTY = "empty.txt"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, text in {**DOCUMENTS, **TABLES}.items():
        (folder / name).write_text(text)
    (folder / EMPTY).write_bytes(b"")
    return folder


def add(deployment: Deployment, corpus: Path, dataset: str) -> None:
    with deployment.memory() as memory:
        result = memory.add_paths([str(corpus)], dataset)
    assert len(result.added) == len(DOCUMENTS) + len(TABLES) + 1, result.errors


def runs_of(memory: Kenning, dataset: str) -> list[PipelineRun]:
    found = memory.wiring.metadata.get_dataset(memory.scope(dataset))
    assert found is not None
    return sorted(memory.wiring.metadata.list_runs(found.id), key=lambda run: run.started_at)


Snapshot = tuple[dict[str, tuple[str, tuple[str, ...]]], dict[str, tuple[str, ...]]]


def graph_of(memory: Kenning, dataset: str) -> Snapshot:
    """Node id -> (type, data ids) and edge id -> data ids; ids must be unique in the export."""
    nodes, edges = memory.wiring.graph.export(memory.scope(dataset))
    node_map = {node.id: (node.type, tuple(sorted(node.data_ids))) for node in nodes}
    edge_map = {edge.id: tuple(sorted(edge.data_ids)) for edge in edges}
    assert len(node_map) == len(nodes) and len(edge_map) == len(edges), "duplicate ids in the graph"
    return node_map, edge_map


def vector_ids(settings: Settings) -> dict[str, set[str]]:
    """Point ids per collection of an embedded home's vectors; for Qdrant local mode, only call
    it once its owner has let go (Qdrant Edge is shared)."""
    if settings.vector_engine == "edge":
        store = EdgeVectorStore(settings.vector_path)
        try:
            return {name: store.point_ids(name) for name in store.list_collections()}
        finally:
            store.close()
    client = QdrantClient(path=str(settings.qdrant_path))
    try:
        found = {}
        for collection in client.get_collections().collections:
            points, more = client.scroll(collection.name, limit=MAX_POINTS, with_payload=False)
            assert more is None, f"more than {MAX_POINTS} points in {collection.name}"
            found[collection.name] = {str(point.id) for point in points}
        return found
    finally:
        client.close()


def embedded_memory(tmp_path: Path, shared: dict[str, str], corpus: Path, dataset: str) -> Settings:
    """Cognify the corpus with the embedded runner (own SQLite home, same settings otherwise);
    the run fails exactly the corpus's empty files."""
    settings = settings_of(kenning_env(**shared, home=str(tmp_path / "embedded")))
    empty = any(path.is_file() and path.stat().st_size == 0 for path in corpus.rglob("*"))
    with Kenning(settings) as memory:
        memory.add_paths([str(corpus)], dataset)
        expected = RunStatus.COMPLETED_WITH_ERRORS if empty else RunStatus.COMPLETED
        assert memory.cognify(dataset).status == expected
    return settings


def finished(request: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _out, err = request.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        request.kill()
        request.communicate()
        raise
    return request.returncode, err


def lock_released(deployment: Deployment, dataset: str, wait_s: float = 10.0) -> bool:
    """Whether the dataset lock is free, waiting a little: a run is reported done just before it lets go."""
    settings = deployment.settings
    client = redis.Redis.from_url(settings.redis_url)
    name = lock_name(Scope(tenant=settings.tenant, dataset=dataset))
    deadline = time.monotonic() + wait_s
    try:
        lock = open_lock(client, settings)
        while lock.holder(name) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True
    finally:
        client.close()


def test_distributed_cognify_builds_the_memory_the_embedded_runner_builds(
    deployment: Deployment, workers: Workers, corpus: Path, tmp_path: Path, shared: dict[str, str]
) -> None:
    # Given a corpus of documents, two related tables and an empty file
    add(deployment, corpus, "library")

    # When it is cognified on the workers
    result = deployment.cognify("library")

    # Then the run completes with the empty file as its one failed item (so the follower exits 1),
    # and the lock is free again
    assert result.returncode == 1, result.stderr + workers.logs()
    with deployment.memory() as memory:
        [run] = runs_of(memory, "library")
        items = {item.name: item for item in memory.wiring.metadata.list_items(run.dataset_id)}
        distributed_graph = graph_of(memory, "library")
    assert run.status == RunStatus.COMPLETED_WITH_ERRORS and run.stats["failed_items"] == 1
    assert run.stats["chunks_to_extract"] > 0 and run.stats["fk_edges"] > 0
    assert items[EMPTY].status == ItemStatus.FAILED and items[EMPTY].error
    assert {item.status for name, item in items.items() if name != EMPTY} == {ItemStatus.DONE}
    assert lock_released(deployment, "library")

    # And the graph and the vector points are those the embedded runner makes of the same input
    workers.stop()
    embedded = embedded_memory(tmp_path, shared, corpus, "library")
    with Kenning(embedded) as memory:
        assert distributed_graph == graph_of(memory, "library")
    assert vector_ids(deployment.settings) == vector_ids(embedded)


def test_cognify_again_on_unchanged_data_extracts_nothing(
    deployment: Deployment, workers: Workers, corpus: Path
) -> None:
    # Given a dataset already cognified on the workers
    add(deployment, corpus, "again")
    first = deployment.cognify("again")
    assert first.returncode == 1, first.stderr + workers.logs()  # the empty file failed

    # When it is cognified again, unchanged
    second = deployment.cognify("again")

    # Then the second run completes without extracting anything, not even from the cache
    assert second.returncode == 0, second.stderr + workers.logs()
    with deployment.memory() as memory:
        runs = runs_of(memory, "again")
    assert [run.status for run in runs] == [RunStatus.COMPLETED_WITH_ERRORS, RunStatus.COMPLETED]
    assert runs[0].stats["chunks_to_extract"] > 0
    assert runs[1].stats.get("extractions", 0) == 0
    assert runs[1].stats.get("cache_hits", 0) == 0 and runs[1].stats["chunks_to_extract"] == 0


def test_concurrent_cognify_requests_on_one_dataset_run_one_after_the_other(
    deployment: Deployment, workers: Workers, corpus: Path
) -> None:
    # Given a dataset with data waiting
    add(deployment, corpus, "shared")

    # When two cognify requests for it are made at the same time
    requests = [
        subprocess.Popen(
            deployment.cognify_command("shared"),
            cwd=ROOT,
            env=deployment.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [finished(request) for request in requests]

    # Then both complete (the first with the empty file failed, so its follower exits 1), and the
    # one that got the lock second found nothing left to do
    codes = sorted(code for code, _err in outputs)
    assert codes == [0, 1], "".join(err for _code, err in outputs) + workers.logs()
    with deployment.memory() as memory:
        runs = runs_of(memory, "shared")
        graph_of(memory, "shared")
    assert sorted(run.status for run in runs) == [RunStatus.COMPLETED, RunStatus.COMPLETED_WITH_ERRORS]
    documents = sorted(run.stats.get("documents", 0) for run in runs)
    assert documents == [0, len(DOCUMENTS) + len(TABLES)]
    assert sorted(run.stats.get("extractions", 0) for run in runs)[0] == 0


def test_a_failing_step_ends_the_run_errored_and_frees_the_lock(
    deployment: Deployment, workers: Workers, tmp_path: Path
) -> None:
    # Given a data item whose stored bytes have gone missing
    source = tmp_path / "lost.txt"
    source.write_text("Nobody will read this text.")
    with deployment.memory() as memory:
        [item] = memory.add_paths([str(source)], "broken").added
    blob = deployment.settings.blob_dir / item.content_hash[:2] / item.content_hash[2:]
    blob.unlink()

    # When the dataset is cognified on the workers
    result = deployment.cognify("broken")

    # Then the run ends errored with the store's error, and the dataset lock is free
    assert result.returncode == 1, result.stderr + workers.logs()
    with deployment.memory() as memory:
        [run] = runs_of(memory, "broken")
    assert run.status == RunStatus.ERRORED
    assert "no blob" in run.error
    assert lock_released(deployment, "broken")
