"""The ECL pipeline end to end on in-memory twins, through the embedded runner."""

from __future__ import annotations

import threading

import pytest

from kenning.pipeline import plan, tasks
from kenning.pipeline.context import Job
from kenning.pipeline.ingest import Source, add, text_source
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import ChunkStatus, Extraction, ItemStatus, PipelineRun, Scope, utcnow
from kenning.pipeline.plan import PLAN, start_run
from kenning.retrieval.contract import SearchRequest, SearchType
from kenning.retrieval.registry import search
from kenning.storage.coordination.lock import MemoryLock
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import CountingExtractor, TwinServices

SCOPE = Scope(tenant="t1", dataset="library")
HOSTILE = "'}) DETACH DELETE n //"
CORPUS = [
    (
        "ada.txt",
        "Ada Lovelace worked with Charles Babbage on the Analytical Engine in London.\n\n"
        "Ada Lovelace wrote the first published algorithm in 1843.",
    ),
    (
        "turing.txt",
        "Alan Turing worked at Bletchley Park during the war. Alan Turing proposed the Turing Test in 1950.",
    ),
    ("hopper.md", "# Grace Hopper\n\nGrace Hopper built the first compiler at Remington Rand in 1952."),
]


def sources(corpus: list[tuple[str, str]]) -> list[Source]:
    return [Source(name=name, uri=f"test:{name}", data=text.encode()) for name, text in corpus]


def cognify(services: TwinServices, scope: Scope = SCOPE) -> dict[str, int]:
    run = LocalRunner(services, services.lock, concurrency=3).run(scope)
    failed = run.stats.get("failed_items", 0) + run.stats.get("failed_chunks", 0)
    assert run.status.value == ("completed_with_errors" if failed else "completed"), run.error
    return run.stats


def snapshot(services: TwinServices, scope: Scope = SCOPE) -> tuple[set[str], set[str]]:
    nodes, edges = services.graph.export(scope)
    return {node.id for node in nodes}, {edge.id for edge in edges}


def test_add_is_deduplicated_by_content() -> None:
    # Given a dataset holding one text
    services = TwinServices()
    first = add(services.metadata, services.blobs, SCOPE, [text_source("same bytes")])
    # When the same bytes are added again, under another name
    second = add(services.metadata, services.blobs, SCOPE, [text_source("same bytes", name="again")])
    # Then nothing new is stored
    assert len(first.added) == 1 and not second.added and len(second.unchanged) == 1
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None and len(services.metadata.list_items(dataset.id)) == 1


def test_cognify_builds_graph_and_vectors() -> None:
    services = TwinServices()
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))

    stats = cognify(services)

    nodes, edges = services.graph.export(SCOPE)
    types = {node.type for node in nodes}
    assert {"Document", "DocumentChunk", "TextSummary", "Entity", "EntityType"} <= types
    names = {node.properties.get("name") for node in nodes if node.type == "Entity"}
    assert {"Ada Lovelace", "Charles Babbage", "Alan Turing", "Grace Hopper"} <= names
    relationships = {edge.relationship for edge in edges}
    assert {"is_part_of", "contains", "is_a", "made_from"} <= relationships
    for collection in (
        "DocumentChunk_text",
        "TextSummary_text",
        "Entity_name",
        "EntityType_name",
        "Edge_description",
    ):
        assert services.vectors.count(SCOPE, collection) > 0, collection
    # The twin extractor is the offline one: extractions, but no LLM calls
    assert stats["extractions"] == stats["chunks_to_extract"] > 0 and stats["llm_calls"] == 0
    assert all(node.data_ids for node in nodes) and all(edge.data_ids for edge in edges)


def test_entity_shared_by_two_documents_is_one_node_with_both_sources() -> None:
    services = TwinServices()
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS[:2]))
    cognify(services)
    nodes, _ = services.graph.export(SCOPE)
    ada = [node for node in nodes if node.properties.get("name") == "Ada Lovelace"]
    assert len(ada) == 1
    add(
        services.metadata, services.blobs, SCOPE, sources([("more.txt", "Ada Lovelace met Mary Somerville.")])
    )
    cognify(services)
    nodes, _ = services.graph.export(SCOPE)
    ada = [node for node in nodes if node.properties.get("name") == "Ada Lovelace"]
    assert len(ada) == 1 and len(ada[0].data_ids) == 2


def test_rerun_on_unchanged_dataset_does_no_extraction() -> None:
    services = TwinServices()
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    cognify(services)
    calls, before = services.extractor.calls, snapshot(services)

    stats = cognify(services)

    assert services.extractor.calls == calls
    assert stats.get("extractions", 0) == stats.get("llm_calls", 0) == 0
    assert snapshot(services) == before


def test_same_input_gives_same_ids_in_any_fresh_store() -> None:
    first, second = TwinServices(), TwinServices()
    for services in (first, second):
        add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
        cognify(services)
    assert snapshot(first) == snapshot(second)


def test_identical_chunk_text_is_extracted_once() -> None:
    services = TwinServices()
    text = "Marie Curie won the Nobel Prize in Physics in 1903."
    add(services.metadata, services.blobs, SCOPE, sources([("a.txt", text)]))
    add(services.metadata, services.blobs, Scope(tenant="t1", dataset="other"), sources([("a.txt", text)]))
    cognify(services)
    cognify(services, Scope(tenant="t1", dataset="other"))
    assert services.extractor.calls == 1


def test_bad_items_are_recorded_and_the_rest_proceeds() -> None:
    # Given a batch with an empty file, binary junk, invalid UTF-8 and a hostile entity name
    services = TwinServices()
    batch = [
        Source(name="empty.txt", uri="test:empty", data=b""),
        Source(name="junk.bin", uri="test:junk", data=bytes(range(256)) * 20),
        Source(name="broken.txt", uri="test:broken", data=b"\xc3\x28\xe2\x82\x28\xf0\x28\x8c\xbc" * 60),
        Source(
            name="hostile.txt",
            uri="test:hostile",
            data=f"Ada Lovelace met {HOSTILE} Somebody in London.".encode(),
        ),
        *sources(CORPUS[:1]),
    ]
    add(services.metadata, services.blobs, SCOPE, batch)
    # When the dataset is cognified
    cognify(services)
    # Then each bad item is failed with a reason, and the good ones are done
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None
    items = {item.name: item for item in services.metadata.list_items(dataset.id)}
    for name in ("empty.txt", "junk.bin", "broken.txt"):
        assert items[name].status == ItemStatus.FAILED and items[name].error, name
    assert "empty" in items["empty.txt"].error
    assert items["hostile.txt"].status == ItemStatus.DONE
    assert items["ada.txt"].status == ItemStatus.DONE
    chunk_texts = [n.properties.get("text", "") for n in services.graph.export(SCOPE)[0]]
    assert any(HOSTILE.strip() in str(text) for text in chunk_texts)


def test_oversized_document_fails_alone() -> None:
    services = TwinServices()
    services.config.max_document_bytes = 1000
    add(services.metadata, services.blobs, SCOPE, sources([("big.txt", "word " * 1000), *CORPUS[:1]]))
    cognify(services)
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None
    items = {item.name: item for item in services.metadata.list_items(dataset.id)}
    assert items["big.txt"].status == ItemStatus.FAILED and "limit" in items["big.txt"].error
    assert items["ada.txt"].status == ItemStatus.DONE


def test_failed_chunk_is_recorded_and_retried_on_the_next_run() -> None:
    # Given an extractor that fails on one document's text
    services = TwinServices(extractor=CountingExtractor(fail_on="Bletchley"))
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    stats = cognify(services)
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None
    failed = services.chunks.list_chunk_ids(dataset.id, ChunkStatus.FAILED)
    assert stats["failed_chunks"] == len(failed) == 1
    assert services.chunks.get_chunks(failed)[0].error.startswith("the model refused")
    names = {n.properties.get("name") for n in services.graph.export(SCOPE)[0]}
    assert "Grace Hopper" in names and "Bletchley Park" not in names
    # When the extractor recovers and the dataset is cognified again
    services.extractor.fail_on = None
    stats = cognify(services)
    # Then only the failed chunk is extracted, and the graph is complete
    assert stats["extractions"] == 1
    assert not services.chunks.list_chunk_ids(dataset.id, ChunkStatus.FAILED)
    assert "Bletchley Park" in {n.properties.get("name") for n in services.graph.export(SCOPE)[0]}


def test_chunks_extracted_under_a_changed_extractor_are_extracted_again() -> None:
    # Given a dataset extracted but not yet loaded
    services = TwinServices(extractor=CountingExtractor())
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    extract_only = [step for step in PLAN if step.name in ("classify", "chunk", "extract")]
    LocalRunner(services, services.lock, plan=extract_only).run(SCOPE)
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None
    extracted = services.chunks.list_chunk_ids(dataset.id, ChunkStatus.EXTRACTED)
    assert extracted
    # When the extractor changes before the load (its cached answers no longer apply)
    services.extractor.prompt_version = "offline-changed"
    stats = cognify(services)
    # Then the next run extracts them again and loads them, and their facts are in the graph
    assert stats["extractions"] == len(extracted) and not stats.get("failed_chunks")
    assert sorted(services.chunks.list_chunk_ids(dataset.id, ChunkStatus.LOADED)) == sorted(extracted)
    names = {n.properties.get("name") for n in services.graph.export(SCOPE)[0]}
    assert "Grace Hopper" in names


def test_load_fails_the_chunks_it_finds_no_extraction_for() -> None:
    # Given a dataset extracted but not yet loaded, whose cached extractions are then gone
    services = TwinServices(extractor=CountingExtractor())
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    extract_only = [step for step in PLAN if step.name in ("classify", "chunk", "extract")]
    run = LocalRunner(services, services.lock, plan=extract_only).run(SCOPE)
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None
    extracted = services.chunks.list_chunk_ids(dataset.id, ChunkStatus.EXTRACTED)
    services.extractor.prompt_version = "offline-changed"
    job = Job(run_id=run.id, dataset_id=dataset.id, tenant=SCOPE.tenant, dataset=SCOPE.dataset)

    # When the load step runs on its own
    counts = tasks.load(services, job)

    # Then no chunk is marked loaded without its graph and vectors: each is failed, saying why
    assert not services.chunks.list_chunk_ids(dataset.id, ChunkStatus.LOADED)
    failed = services.chunks.get_chunks(services.chunks.list_chunk_ids(dataset.id, ChunkStatus.FAILED))
    assert sorted(chunk.id for chunk in failed) == sorted(extracted)
    assert all("no extraction" in chunk.error for chunk in failed)
    assert counts["failed_chunks"] == len(extracted)


def test_structured_rows_get_foreign_key_edges() -> None:
    services = TwinServices()
    customers = "id,name\n1,Ada\n2,Grace\n"
    orders = "id,customer_id,item\n10,1,loom\n11,2,compiler\n12,9,nothing\n"
    add(
        services.metadata,
        services.blobs,
        SCOPE,
        sources([("customers.csv", customers), ("orders.csv", orders)]),
    )
    stats = cognify(services)
    _, edges = services.graph.export(SCOPE)
    fk = [edge for edge in edges if edge.relationship == "customer_id"]
    assert len(fk) == 2  # the order for customer 9 refers to nothing
    assert stats["fk_nodes"] == 5 and stats["fk_edges"] == 2


def test_chunks_and_graph_search_cite_their_sources() -> None:
    services = TwinServices()
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    cognify(services)
    for kind in (SearchType.CHUNKS, SearchType.GRAPH_COMPLETION):
        result = search(
            services, SearchRequest(query="Who built the first compiler?", type=kind, scopes=[SCOPE])
        )
        assert result.results, kind
        assert result.answer is None and result.notice and "LLM" in result.notice
        top = result.results[0]
        assert top.chunk_id and top.document_id and top.data_id, kind
    chunks = search(
        services, SearchRequest(query="Grace Hopper compiler", type=SearchType.CHUNKS, scopes=[SCOPE])
    )
    assert "Grace Hopper" in chunks.results[0].text


def test_search_never_crosses_datasets() -> None:
    services = TwinServices()
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    cognify(services)
    other = Scope(tenant="t1", dataset="empty")
    for kind in (SearchType.CHUNKS, SearchType.GRAPH_COMPLETION):
        result = search(
            services, SearchRequest(query="Ada Lovelace", type=kind, scopes=[other], only_context=True)
        )
        assert result.results == [] and result.context == ""


def test_plan_is_the_five_ecl_steps_in_order() -> None:
    assert [step.name for step in PLAN] == ["classify", "chunk", "extract", "load", "fk_edges"]
    assert [step.name for step in PLAN if step.fan_out] == ["extract"]


def test_local_runner_holds_the_dataset_lock_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a dataset, and an extractor that tries the dataset's lock each time the runner calls it
    services = TwinServices()
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    name = lock_name(SCOPE)
    taken_while_running: list[int | None] = []
    extract = services.extractor.extract

    def trying_the_lock(text: str) -> Extraction:
        token = services.lock.acquire(name, 60)
        taken_while_running.append(token)
        if token is not None:
            services.lock.release(name, token)
        return extract(text)

    monkeypatch.setattr(services.extractor, "extract", trying_the_lock)
    # When the embedded runner cognifies it
    cognify(services)
    # Then nobody else could take the lock during the run, and the run let go of it at the end
    assert taken_while_running and all(token is None for token in taken_while_running)
    assert services.lock.acquire(name, 60) is not None


def test_local_runner_waits_for_a_dataset_lock_held_elsewhere() -> None:
    # Given a dataset whose lock another holder has
    services = TwinServices()
    add(services.metadata, services.blobs, SCOPE, sources(CORPUS))
    name = lock_name(SCOPE)
    token = services.lock.acquire(name, 60)
    assert token is not None
    # When a run starts, and the other holder lets go once the run, refused the lock, asked again
    lock = RefusalsSeen(services.lock, count=2)
    runs: list[PipelineRun] = []
    runner = threading.Thread(target=lambda: runs.append(LocalRunner(services, lock).run(SCOPE)))
    runner.start()
    assert lock.refused.wait(timeout=30)
    dataset = services.metadata.get_dataset(SCOPE)
    assert dataset is not None
    started_while_held = services.metadata.list_runs(dataset.id)
    services.lock.release(name, token)
    runner.join(timeout=30)
    # Then the run began only once the lock was free, and completed
    assert started_while_held == []
    assert [run.status.value for run in runs] == ["completed"]


class RefusalsSeen:
    """A lock that sets `refused` once it has refused `count` acquisitions."""

    def __init__(self, lock: MemoryLock, count: int) -> None:
        self._lock = lock
        self._left = count
        self.refused = threading.Event()

    def acquire(self, name: str, ttl_s: float) -> int | None:
        token = self._lock.acquire(name, ttl_s)
        if token is None:
            self._left -= 1
            if self._left <= 0:
                self.refused.set()
        return token

    def release(self, name: str, token: int) -> None:
        self._lock.release(name, token)


def test_runs_started_at_the_same_instant_get_their_own_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    services = TwinServices()
    # Given a clock that gives two processes starting a run of one dataset the same instant
    # (two `kenning cognify --distributed` at once did, and both sent the same run to the workers)
    instant = utcnow()
    monkeypatch.setattr(plan, "utcnow", lambda: instant)
    scope = Scope(tenant="t", dataset="same")

    # When both start a run
    first, second = start_run(services, scope), start_run(services, scope)

    # Then they are two runs, each recorded
    assert first.run_id != second.run_id
    assert {run.id for run in services.metadata.list_runs(first.dataset_id)} == {first.run_id, second.run_id}
